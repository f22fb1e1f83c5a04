// Work split into blocks handed out one at a time to the calling thread and
// to tasks of a thread pool.
//
// TensorFlow's Shard and ThreadPool::ParallelFor (Eigen's parallelFor) give
// the blocks to the pool's threads and, when there are more blocks than
// threads, have the caller only wait: every call then waits for pool threads
// to wake, and one that wakes late (an idle core of a VM, a busy machine)
// holds up the whole call. Here the caller starts on a block at once and
// takes every block no other thread has taken; a pool task that starts after
// the last block was taken finds none left and returns, touching nothing of
// the caller's. The caller returns when every block is done.
//
// The SpMM and SDDMM ops and XLA's sparse convolution run on it. Against
// Shard here (2 cores, same-process A/B, the ops alone in a loop, fastest
// of 60): the SpMMs at batch 32 0.90-0.96x the time, the SDDMM 0.82-0.89x;
// at batch 256 the same (0.96-1.10x); a SparseDense training step at batch
// 32 0.93-0.98x, at 256 0.98-1.02x. TensorFlow's sparse convolution op
// keeps ParallelFor: its layer took 1.02-1.08x the time on this (medians).
#ifndef TFSPARSE_OPS_KERNELS_BLOCKS_H_
#define TFSPARSE_OPS_KERNELS_BLOCKS_H_

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>

namespace tfsparse {

// Who schedules the pool's tasks. kFromTasks: the caller schedules two and
// every task two more as it starts, until there are threads - 1, so the
// caller pays for two whatever the pool's size (scheduling a task that
// wakes a thread is a system call; serial if the caller scheduled them all).
// A task may then schedule after Run returned: only for pools that outlive
// the call, as TensorFlow's intra-op pool. kFromCaller: the caller
// schedules every task (XLA's thread pool, an object of the call).
enum class Scheduling { kFromCaller, kFromTasks };

class Blocks {
 public:
  // Runs fn(i) for every block i in [0, count) on the calling thread and up
  // to threads - 1 tasks of `pool` (anything with Schedule(std::function<
  // void()>): TensorFlow's thread::ThreadPool, XLA's ffi::ThreadPool).
  template <typename Pool>
  static void Run(Pool& pool, int64_t threads, int64_t count, Scheduling scheduling,
                  const std::function<void(int64_t)>& fn) {
    if (count <= 0) return;
    const int64_t helpers = std::min(threads, count) - 1;
    if (helpers <= 0) {
      for (int64_t i = 0; i < count; ++i) fn(i);
      return;
    }
    auto blocks = std::make_shared<Blocks>(count, helpers, fn);
    if (scheduling == Scheduling::kFromTasks) {
      blocks->schedule_ = [&pool](std::function<void()> task) { pool.Schedule(std::move(task)); };
      Spawn(blocks);
    } else {
      for (int64_t i = 0; i < helpers; ++i) pool.Schedule([blocks] { blocks->Take(); });
    }
    blocks->Take();
    blocks->WaitForAll();
  }

  // Runs fn(begin, end) for the ranges [0, block), [block, 2 block), ...
  // of [0, total), as Run.
  template <typename Pool>
  static void RunRanges(Pool& pool, int64_t threads, int64_t total, int64_t block,
                        Scheduling scheduling,
                        const std::function<void(int64_t, int64_t)>& fn) {
    block = std::max<int64_t>(1, block);
    Run(pool, threads, (total + block - 1) / block, scheduling, [&](int64_t i) {
      fn(i * block, std::min(total, (i + 1) * block));
    });
  }

  // The block size that splits `total` into about `per_thread` blocks for
  // each of `threads` threads: fine enough that the threads that start
  // first can take the late ones' share.
  static int64_t SizeFor(int64_t total, int64_t threads, int64_t per_thread) {
    return std::max<int64_t>(1, (total + per_thread * threads - 1) / (per_thread * threads));
  }

  Blocks(int64_t count, int64_t helpers, const std::function<void(int64_t)>& fn)
      : count_(count), helpers_(helpers), fn_(&fn) {}

 private:
  // Schedules up to two more tasks (kFromTasks), each of which does the
  // same as it starts, while blocks are left and fewer than helpers_ were
  // scheduled.
  static void Spawn(const std::shared_ptr<Blocks>& blocks) {
    for (int n = 0; n < 2; ++n) {
      if (blocks->next_.load() >= blocks->count_ ||
          blocks->spawned_.fetch_add(1) >= blocks->helpers_) {
        return;
      }
      blocks->schedule_([blocks] {
        Spawn(blocks);
        blocks->Take();
      });
    }
  }

  // Blocks, one at a time, until none is left.
  void Take() {
    for (int64_t i; (i = next_.fetch_add(1)) < count_;) {
      (*fn_)(i);
      if (done_.fetch_add(1) + 1 == count_) {
        std::lock_guard<std::mutex> lock(mutex_);
        all_done_.notify_all();
      }
    }
  }

  // Every block was taken; the last ones may still run on other threads.
  // (Spinning here for up to 2000 yields first measured no different.)
  void WaitForAll() {
    std::unique_lock<std::mutex> lock(mutex_);
    all_done_.wait(lock, [&] { return done_.load() == count_; });
  }

  const int64_t count_, helpers_;
  // The pool's Schedule (kFromTasks); the pool outlives every task.
  std::function<void(std::function<void()>)> schedule_;
  std::atomic<int64_t> spawned_{0};
  // The caller's; called only for blocks taken before the last one, so
  // never after Run returned.
  const std::function<void(int64_t)>* const fn_;
  std::atomic<int64_t> next_{0}, done_{0};
  std::mutex mutex_;
  std::condition_variable all_done_;
};

}  // namespace tfsparse

#endif  // TFSPARSE_OPS_KERNELS_BLOCKS_H_
