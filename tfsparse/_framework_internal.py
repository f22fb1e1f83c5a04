"""The one place where tfsparse reads non-public attributes of its frameworks.

tf_keras (its models and optimizers), TensorFlow's lazy ``tf.keras`` loader
and Horovod's Keras callbacks keep a few things tfsparse needs in underscore attributes, with no public
equivalent. Every such read or write goes through this file (TensorFlow's own
non-public modules go through ``tfsparse.ops._tf_internal``), and each is
read directly, never with a default: an upgrade that renames one breaks here,
loudly, and ``tests/test_framework_internal.py`` says which.

This module imports no framework: ``tfsparse._keras`` uses it before Keras is
loaded.
"""

# tf_keras: the model's own step counters, which fit/evaluate/predict read to
# report progress and to check that a step function ran.
_STEP_COUNTERS = {
    "train": "_train_counter",
    "test": "_test_counter",
    "predict": "_predict_counter",
}


def model_level_losses(model):
    """The loss callables added by ``model.add_loss`` on the model itself.

    ``model.losses`` mixes them with its layers' losses; tf_keras keeps the
    model's own in ``_callable_losses``.

    Example:
      >>> from tfsparse._keras import keras
      >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
      >>> model.add_loss(lambda: 0.0)
      >>> len(model_level_losses(model))
      1
    """
    return list(model._callable_losses)


def compiled_losses(model):
    """The losses given to ``model.compile`` (strings, functions, ``Loss`` objects), flat.

    tf_keras keeps them, as given (one, a list or a dict), in
    ``compiled_loss._user_losses``.

    Example:
      >>> from tfsparse._keras import keras
      >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
      >>> model.compile("sgd", keras.losses.MeanSquaredError(reduction="sum"))
      >>> [loss.reduction for loss in compiled_losses(model)]
      ['sum']
    """
    pending, flat = [model.compiled_loss._user_losses], []
    while pending:
        losses = pending.pop(0)
        if isinstance(losses, dict):
            pending[:0] = list(losses.values())
        elif isinstance(losses, (list, tuple)):
            pending[:0] = list(losses)
        else:
            flat.append(losses)
    return flat


def is_graph_network(model):
    """True for a Sequential or functional model (a graph of layers Keras can clone).

    Example:
      >>> from tfsparse._keras import keras
      >>> inputs = keras.Input((2,))
      >>> is_graph_network(keras.Model(inputs, keras.layers.Dense(1)(inputs)))
      True
    """
    return bool(model._is_graph_network)


def nested_inputs_outputs(model):
    """A graph network's inputs and outputs in the structures it was built
    with (a dict, a list, one tensor); ``model.inputs`` and ``model.outputs``
    are their flattened lists.

    Example:
      >>> from tfsparse._keras import keras
      >>> x = keras.Input((2,), name="x")
      >>> model = keras.Model({"x": x}, {"y": keras.layers.Dense(1)(x)})
      >>> [sorted(structure) for structure in nested_inputs_outputs(model)]
      [['x'], ['y']]
    """
    return model._nested_inputs, model._nested_outputs


def count_steps(model, kind, steps):
    """Adds ``steps`` to the model's ``kind`` step counter ("train", "test", "predict").

    A step function that replaces Keras's own must count its steps as
    Keras's does.

    Example:
      >>> from tfsparse._keras import keras
      >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
      >>> model.compile(loss="mse")
      >>> int(count_steps(model, "test", 3))
      3
    """
    return getattr(model, _STEP_COUNTERS[kind]).assign_add(steps)


def set_horovod_callback_backend(callback, backend):
    """Hands a Horovod Keras callback the Keras backend it computes with.

    Horovod's callback implementations keep the backend they were built with
    in a plain ``backend`` attribute (``horovod._keras.callbacks``).

    Example:
      >>> import horovod.tensorflow.keras as hvd_keras
      >>> from tfsparse._keras import keras
      >>> callback = hvd_keras.callbacks.MetricAverageCallback()
      >>> set_horovod_callback_backend(callback, keras.backend)
      >>> callback.backend is keras.backend
      True
    """
    if "backend" not in vars(callback):
        raise AttributeError(
            f"{type(callback).__name__} keeps no `backend` attribute: this Horovod "
            "version changed how its Keras callbacks hold the backend."
        )
    callback.backend = backend


def tf_keras_resolved_to_keras_3(tensorflow):
    """True when ``tensorflow.keras`` was already used and resolved to Keras 3.

    Only instance dictionaries are read: any attribute lookup on TensorFlow's
    lazy loader (even ``__name__``) would resolve it, to Keras 3.

    Args:
      tensorflow: the imported ``tensorflow`` module, or None if it is not.

    Example:
      >>> tf_keras_resolved_to_keras_3(None)
      False
    """
    resolved = vars(tensorflow).get("keras") if tensorflow is not None else None
    if resolved is None:
        return False
    state = vars(resolved)
    if type(resolved).__name__ == "KerasLazyLoader":
        return bool(state["_tfll_initialized"]) and state["_tfll_keras_version"] == "keras_3"
    # After first use the loader is replaced by the module itself:
    # keras._tf_keras.keras for Keras 3, tf_keras.api._v2.keras for Keras 2.
    return str(state.get("__name__", "")).split(".")[0] == "keras"


def optimizer_slot_index(optimizer, variable):
    """``(index, count)``: where tf_keras's optimizer keeps ``variable``'s slots.

    The (non-legacy) optimizer keeps each slot kind in a list with one entry
    per variable it has built, at the variable's index in ``_index_dict``
    (keyed by ``_var_key``). Returns None before the optimizer built the
    variable's slots.
    """
    if "_index_dict" not in vars(optimizer):  # build() makes it, at the first step
        return None
    index = optimizer._index_dict.get(optimizer._var_key(variable))
    return None if index is None else (index, len(optimizer._index_dict))


def accumulator_slots(optimizer):
    """Adagrad's and Ftrl's (non-legacy) accumulator slots, one per built variable.

    They start at ``initial_accumulator_value``, not 0; tf_keras keeps them
    in ``_accumulators`` (empty before the first step).
    """
    return list(vars(optimizer).get("_accumulators", []))


def legacy_initial_accumulator_value(optimizer):
    """The value a legacy Adagrad's or Ftrl's "accumulator" slots start at."""
    return optimizer._initial_accumulator_value


def steps_per_execution(model):
    """How many steps the model's next train, test or predict execution runs.

    tf_keras keeps it in ``_steps_per_execution``; ``fit`` shortens it for
    the last execution of an epoch before ``on_train_batch_begin``.

    Example:
      >>> from tfsparse._keras import keras
      >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
      >>> model.compile(loss="mse", steps_per_execution=4)
      >>> steps_per_execution(model)
      4
    """
    return int(model._steps_per_execution.numpy())
