// The input gradient's pattern, permuted once and kept while it is unchanged.
//
// dy @ W^T takes W's nonzeros in row-major order: TfsparseSpmm gets the
// column-major pattern (idx, seg) and the permutation `order`, and needs
// idx[order[k]] and the segment pointers of seg[order[k]]. Those random
// reads cost more than the product at small batches (0.37 of 0.57 ms at
// batch 8 here), yet they change only when the pattern does. So each op
// keeps the permuted pattern of the patterns it used lately, with copies of
// the (order, idx, seg) it was made from: a call whose inputs equal a kept
// entry's, compared in full, reuses it: the sequential comparison and the
// values' gather took 0.16-0.24 ms of the op at batch 8 here, against the
// 0.37 ms above. The comparison, not an assumption, decides: a pattern that
// changed in place (RigL, a restored checkpoint) is permuted and validated
// again.
#ifndef TFSPARSE_OPS_KERNELS_ORDERED_PATTERN_H_
#define TFSPARSE_OPS_KERNELS_ORDERED_PATTERN_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace tfsparse {

// A pattern in `order`, validated: the entries of `order` are in [0, nnz),
// seg[order[k]] is sorted and in [0, units), and every idx[order[k]] is at
// most `max_idx`.
struct OrderedPattern {
  std::vector<int32_t> order, idx, seg;  // the inputs it was made from
  std::vector<int32_t> idx_in_order;     // idx[order[k]]
  std::vector<int64_t> ptr;              // segment pointers of seg[order[k]]
  uint32_t max_idx = 0;                  // the largest idx, read as uint32

  // Whether entries [begin, end) of order_in, idx_in and seg_in (nnz each)
  // equal those this pattern was made from.
  bool MadeFrom(const int32_t* order_in, const int32_t* idx_in,
                const int32_t* seg_in, int64_t begin, int64_t end) const {
    const size_t bytes = static_cast<size_t>(end - begin) * sizeof(int32_t);
    return std::memcmp(order.data() + begin, order_in + begin, bytes) == 0 &&
           std::memcmp(idx.data() + begin, idx_in + begin, bytes) == 0 &&
           std::memcmp(seg.data() + begin, seg_in + begin, bytes) == 0;
  }
};

// The patterns an op permuted lately, newest first: at most kCapacity, each
// dropped once kStaleCalls calls in a row have not used it (so a pattern
// that RigL moved is not kept for long). Several are kept because eagerly
// run ops share one kernel among the layers whose attributes match (units,
// dtype, isa), which then take turns. Safe to use from concurrent calls.
class OrderedPatternCache {
 public:
  static constexpr size_t kCapacity = 4;
  static constexpr uint64_t kStaleCalls = 2 * kCapacity;
  static constexpr int64_t kPrefix = 64;

  // The newest kept entry of nnz nonzeros whose first entries (up to
  // kPrefix of each input) match, or null: the candidate the caller then
  // compares in full (OrderedPattern::MadeFrom), in parallel, and reports
  // with Used if it matches.
  std::shared_ptr<const OrderedPattern> Candidate(const int32_t* order,
                                                  const int32_t* idx,
                                                  const int32_t* seg,
                                                  int64_t nnz) {
    std::vector<Kept> entries;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++calls_;
      entries_.erase(std::remove_if(entries_.begin(), entries_.end(),
                                    [&](const Kept& kept) {
                                      return calls_ - kept.last_used >
                                             kStaleCalls;
                                    }),
                     entries_.end());
      entries = entries_;
    }
    // Compared outside the lock: entries are never modified once kept.
    for (const Kept& kept : entries) {
      if (static_cast<int64_t>(kept.pattern->order.size()) == nnz &&
          kept.pattern->MadeFrom(order, idx, seg, 0, std::min(nnz, kPrefix))) {
        return kept.pattern;
      }
    }
    return nullptr;
  }

  // Records that `pattern` (a Candidate) served this call.
  void Used(const OrderedPattern* pattern) {
    std::lock_guard<std::mutex> lock(mu_);
    for (Kept& kept : entries_) {
      if (kept.pattern.get() == pattern) kept.last_used = calls_;
    }
  }

  void Keep(std::shared_ptr<const OrderedPattern> pattern) {
    std::lock_guard<std::mutex> lock(mu_);
    entries_.insert(entries_.begin(), Kept{std::move(pattern), calls_});
    if (entries_.size() > kCapacity) entries_.resize(kCapacity);
  }

 private:
  struct Kept {
    std::shared_ptr<const OrderedPattern> pattern;
    uint64_t last_used;  // the value of calls_ then
  };

  std::mutex mu_;
  std::vector<Kept> entries_;
  uint64_t calls_ = 0;  // Candidate's calls so far
};

}  // namespace tfsparse

#endif  // TFSPARSE_OPS_KERNELS_ORDERED_PATTERN_H_
