"""The per-position state an optimizer keeps for a variable.

When a layer's nonzeros move, every state shaped like its values vector
moves with them: the optimizer's slots (Adam's moments, momentum, ...), and
the error-feedback residuals and the sums of gradients over
``backward_passes_per_step`` passes of ``tfsparse.horovod.DistributedOptimizer``.
Keras has no public way to list a variable's slots in its new optimizers:
``tfsparse._framework_internal.optimizer_slot_index`` reads where they are
(tests/dynamic/test_optimizer_state.py and tests/test_framework_internal.py
fail loudly if an upgrade moves them), and the slot lists are the
optimizer's attributes with one variable per built variable.
"""

import tensorflow as tf

from tfsparse import _framework_internal
from tfsparse._keras import keras
from tfsparse._keras import unwrap_loss_scaling


def slots_of(optimizer, variable):
    """The optimizer's slot variables of ``variable`` (empty before its first step)."""
    optimizer = unwrap_loss_scaling(optimizer)
    if isinstance(optimizer, keras.optimizers.legacy.Optimizer):
        slots = []
        for name in optimizer.get_slot_names():
            try:
                slots.append(optimizer.get_slot(variable, name))
            except KeyError:  # created at the first step
                pass
        return slots
    position = _framework_internal.optimizer_slot_index(optimizer, variable)
    if position is None:
        return []
    index, count = position
    slots = []
    for attribute in vars(optimizer).values():
        if (isinstance(attribute, list) and len(attribute) == count
                and all(isinstance(v, tf.Variable) for v in attribute)):
            slots.append(attribute[index])
    return slots


def residual_of(optimizer, variable):
    """The error-feedback residual of ``variable``, or None without one."""
    exchange = getattr(unwrap_loss_scaling(optimizer), "compression_exchange", None)
    return None if exchange is None else exchange.residual_of(variable)


def fresh_value(optimizer, variable, state):
    """What ``state`` (one of ``position_state``'s) holds for a position not yet stepped.

    0, but for Adagrad's and Ftrl's accumulators, which start at their
    ``initial_accumulator_value`` (Ftrl's update divides by a power of it:
    at 0 a grown weight became NaN).
    """
    optimizer = unwrap_loss_scaling(optimizer)
    if isinstance(optimizer, (keras.optimizers.Adagrad, keras.optimizers.Ftrl)):
        if any(state is slot for slot in _framework_internal.accumulator_slots(optimizer)):
            return float(optimizer.initial_accumulator_value)
    elif isinstance(optimizer, (keras.optimizers.legacy.Adagrad, keras.optimizers.legacy.Ftrl)):
        if state is optimizer.get_slot(variable, "accumulator"):
            return float(_framework_internal.legacy_initial_accumulator_value(optimizer))
    return 0.0


def accumulated_of(optimizer, variable):
    """The sum of ``variable``'s gradients over the passes so far, or None without one."""
    accumulator = getattr(unwrap_loss_scaling(optimizer), "gradient_accumulator", None)
    return None if accumulator is None else accumulator.sum_of(variable)


# Optimizers whose state of a variable is not one entry per position
# (Adafactor keeps factored row and column statistics): a moving pattern
# cannot carry it.
_FACTORED = (keras.optimizers.Adafactor,)


def check_moves_with_positions(optimizer):
    """Raises ``NotImplementedError`` for an optimizer whose state cannot follow a moving pattern.

    The check ``position_state`` makes at the first update, made before
    training (``DynamicSparsity.on_train_begin``).
    """
    inner = unwrap_loss_scaling(optimizer) if optimizer is not None else None
    if isinstance(inner, _FACTORED):
        raise NotImplementedError(
            f"The optimizer {type(inner).__name__} keeps factored (not per-position) "
            "statistics of each variable: only per-position states can follow a moving "
            "pattern. Use Adam, SGD, RMSprop, Adagrad or another optimizer with per-weight "
            "slots.")


def position_state(optimizer, variable):
    """Every variable shaped like ``variable`` whose entries follow its positions."""
    if optimizer is None:
        return []
    state = slots_of(optimizer, variable)
    state += [extra for extra in (residual_of(optimizer, variable),
                                  accumulated_of(optimizer, variable)) if extra is not None]
    for slot in state:
        if slot.shape != variable.shape:
            raise NotImplementedError(
                f"The optimizer {type(optimizer).__name__} keeps a state of shape "
                f"{slot.shape} for {variable.name} (of shape {variable.shape}): only "
                "per-position states can follow a moving pattern."
            )
    return state
