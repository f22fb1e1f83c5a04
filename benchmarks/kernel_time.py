"""A kernel op's own time, without TensorFlow's cost of calling a function.

Calling a ``tf.function`` costs a fixed time whatever it computes (on this
project's 2-core VMs 0.6-1.2 ms: dispatch in Python, and a wait for an
inter-op thread to finish the call), which at batch 256 is as long as the
SpMM itself. A kernel's fraction of its roofline bound is a property of the
kernel, so here each op runs ``iterations`` times in sequence inside one
graph call (a ``tf.while_loop`` with ``parallel_iterations=1``; the op's
inputs travel through the loop, so nothing is hoisted out of it or shared
between iterations), and once inside the same loop in another function.
The difference of the two medians over ``iterations - 1`` is the op's time.
The loop's own bookkeeping per iteration stays in: the figure can only be a
little high.

Example:
  >>> import tensorflow as tf
  >>> seconds = per_op_seconds({"add": (tf.add, (tf.ones(4), tf.ones(4)), None)},
  ...                          repeats=3, iterations=3)
  >>> list(seconds)
  ['add']
"""

import contextlib

import numpy as np
import tensorflow as tf

from timing import interleaved_medians


def looped(op, inputs, iterations, variant=None):
    """A zero-argument callable running ``op(*inputs)`` ``iterations`` times in one call.

    Args:
      op: a function of tensors returning one tensor.
      inputs: the op's input tensors.
      iterations: how many times the op runs, one after the other (>= 1).
      variant: the tfsparse kernel variant the op is traced under, or None.
    """
    from tfsparse.ops import kernels

    inputs = tuple(tf.convert_to_tensor(t) for t in inputs)

    @tf.function
    def run(*inputs):
        def body(i, inputs, out):
            return i + 1, inputs, op(*inputs)

        _, _, out = tf.while_loop(lambda i, inputs, out: i < iterations - 1, body,
                                  (tf.constant(0), inputs, op(*inputs)),
                                  parallel_iterations=1)
        return out

    with kernels.use_isa(variant) if variant else contextlib.nullcontext():
        run.get_concrete_function(*inputs)
    return lambda: np.asarray(run(*inputs))


def per_op_seconds(ops, repeats, iterations=11):
    """Each op's own time in seconds, the loops of all of them interleaved.

    Args:
      ops: dict name -> (op, inputs, variant), as ``looped`` takes them.
      repeats: timed calls of each loop (medians).
      iterations: the long loop's length; the short loop runs the op once.
    """
    loops = {}
    for name, (op, inputs, variant) in ops.items():
        loops[f"{name} x1"] = looped(op, inputs, 1, variant)
        loops[f"{name} x{iterations}"] = looped(op, inputs, iterations, variant)
    medians = interleaved_medians(loops, repeats=repeats)
    return {name: (medians[f"{name} x{iterations}"] - medians[f"{name} x1"]) / (iterations - 1)
            for name in ops}
