"""RigL's grow gradient from the training step itself: the step's batch and backward pass.

RigL (Evci et al. 2020; google-research/rigl's ``SparseRigLOptimizer``)
scores inactive positions with the dense kernel gradient of the current
batch, which the training step computes anyway before the optimizer applies
it. For a layer ``z = x @ W + b`` that gradient is ``x^T @ dz``: the
layer's 2-D inputs ``x`` and the loss gradient ``dz`` with respect to its
pre-activation outputs are all it takes; for a ``SparseConv2D`` the same
pair (4-D, channels last) gives it by ``Conv2DBackpropFilter``. ``StepGradients`` keeps them, at
armed steps, in variables the update reads after the step:

- ``install(model)`` wraps the model's ``train_step`` (the user's own, if
  overridden: the wrapper calls it) so that, while Keras traces the step,
  each layer's output passes through an identity whose gradient function
  copies ``x`` and ``dz`` into the variables when ``armed`` is set. Only
  that train function (traced once per compiled model) has the identities;
  predict, evaluate and saving never see them.
- The step's loss is whatever its ``train_step`` differentiates: the
  compiled loss with sample weights, regularization, several outputs, dict
  inputs, any data source.
- ``remove(model)`` restores ``train_step`` and Keras's own train
  function, so the model after ``fit`` is the model before it.

Example:
    >>> import numpy as np
    >>> from tfsparse._keras import keras
    >>> from tfsparse.layers import SparseDense
    >>> layer = SparseDense(2, density=0.5, seed=0)
    >>> model = keras.Sequential([keras.Input((4,)), layer])
    >>> model.compile("sgd", "mse")
    >>> capture = StepGradients([layer])
    >>> capture.install(model)
    >>> capture.arm()
    >>> _ = model.train_on_batch(np.ones((3, 4), "float32"), np.zeros((3, 2), "float32"))
    >>> (x, dz), = capture.captured(steps=1)
    >>> capture.remove(model)
    >>> tuple(x.shape), tuple(dz.shape), "train_step" in vars(model)
    ((3, 4), (3, 2), False)
"""

import tensorflow as tf

_ORIGINAL = "_tfsparse_step_gradients_original"  # the wrapped step, on the wrapper
_PREVIOUS = "_tfsparse_step_gradients_previous"  # the instance attribute it replaced
_PLAIN = "_tfsparse_step_gradients_plain"  # Keras's train function, on ours


class StepGradients:
    """Each layer's inputs and output gradient at the armed training steps.

    Args:
      layers: the built SparseDense and SparseConv2D layers whose gradients to keep.
    """

    def __init__(self, layers):
        self.layers = list(layers)
        self._index = {id(layer): index for index, layer in enumerate(self.layers)}
        self._tracing = False
        self._function = None  # the train function with the identities, once traced
        self.armed = tf.Variable(False, trainable=False, name="step_gradients_armed")
        self._inputs, self._gradients, self._counts = [], [], []
        for layer in self.layers:
            dtype = tf.as_dtype(layer.dtype)  # the variables' dtype (float32 under mixed precision)
            for store, shape in zip((self._inputs, self._gradients), _captured_shapes(layer)):
                store.append(tf.Variable(tf.zeros([0 if d is None else d for d in shape], dtype),
                                         trainable=False, shape=tf.TensorShape(shape)))
            self._counts.append(tf.Variable(0, dtype=tf.int64, trainable=False))

    # ------------------------------------------------------------ the model
    def install(self, model):
        """Wraps ``model.train_step`` and gives the model a train function that keeps gradients.

        The train function is traced once per compiled model: a later
        ``install`` on the same model reuses it while Keras's own cached
        function is unchanged (``compile`` would replace it).
        """
        previous = vars(model).get("train_step")
        if previous is not None and hasattr(previous, _ORIGINAL):
            _restore(model, previous)  # left by a fit that raised before on_train_end
            previous = vars(model).get("train_step")
        original = model.train_step

        def train_step(data):
            self._tracing = True  # Python: runs while Keras traces the step
            try:
                return original(data)
            finally:
                self._tracing = False

        setattr(train_step, _ORIGINAL, original)
        setattr(train_step, _PREVIOUS, previous)
        model.train_step = train_step
        for layer in self.layers:
            layer._gradient_probe = self._probe
        plain = model.train_function
        plain = getattr(plain, _PLAIN, plain)  # ours, left by a fit that raised
        if self._function is None or getattr(self._function, _PLAIN) is not plain:
            self._function = model.make_train_function(force=True)
            setattr(self._function, _PLAIN, plain)
        model.train_function = self._function

    def remove(self, model):
        """Restores ``train_step`` and Keras's own train function."""
        wrapper = vars(model).get("train_step")
        if wrapper is not None and hasattr(wrapper, _ORIGINAL):
            _restore(model, wrapper)
        for layer in self.layers:
            if layer._gradient_probe == self._probe:
                layer._gradient_probe = None
        model.train_function = getattr(model.train_function, _PLAIN, model.train_function)

    # ------------------------------------------------------------ the steps
    def arm(self):
        """Keeps the gradients of the following steps (each overwrites the last)."""
        for count in self._counts:
            count.assign(0)
        self.armed.assign(True)

    def disarm(self):
        self.armed.assign(False)

    def captured(self, steps):
        """``[(inputs, output_gradients)]`` per layer, of the last armed step.

        Args:
          steps: how many steps ran since ``arm()``; each layer must have
            been differentiated exactly once per step.
        """
        for layer, count in zip(self.layers, self._counts):
            count = int(count.numpy())
            if count == 0:
                raise RuntimeError(
                    f"The training step did not backpropagate through {layer.name}: RigL "
                    "needs its gradient (is the layer frozen, or does a custom train_step "
                    "differentiate another loss?).")
            if count != steps:
                raise NotImplementedError(
                    f"RigL needs one call per layer and step; {layer.name} was "
                    f"differentiated {count} times in {steps} step(s) (a shared layer).")
        return [(x.read_value(), dz.read_value())
                for x, dz in zip(self._inputs, self._gradients)]

    def _probe(self, layer, inputs, outputs):
        """The layers' call hook: an identity that keeps ``(inputs, dz)`` when armed."""
        if not self._tracing:
            return outputs
        index = self._index[id(layer)]

        def keep(gradient):
            stored = [
                self._inputs[index].assign(tf.cast(inputs, self._inputs[index].dtype)),
                self._gradients[index].assign(tf.cast(gradient, self._gradients[index].dtype)),
                self._counts[index].assign_add(1),
            ]
            with tf.control_dependencies(stored):
                return tf.constant(True)

        @tf.custom_gradient
        def identity(z):
            def gradient_function(gradient):
                kept = tf.cond(self.armed, lambda: keep(gradient), lambda: tf.constant(False))
                with tf.control_dependencies([kept]):
                    return tf.identity(gradient)

            return tf.identity(z), gradient_function

        return identity(outputs)


def _captured_shapes(layer):
    """The shapes of a layer's kept inputs and output gradient (None: any size)."""
    from tfsparse.layers import SparseConv2D

    if isinstance(layer, SparseConv2D):
        return [None, None, None, layer.input_channels], [None, None, None, layer.filters]
    return [None, layer.input_dim], [None, layer.units]


def _restore(model, wrapper):
    previous = getattr(wrapper, _PREVIOUS)
    if previous is None:
        del model.train_step
    else:
        model.train_step = previous
