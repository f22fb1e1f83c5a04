"""DynamicSparsity: SET and RigL drop-and-grow updates of SparseDense and SparseConv2D layers."""

import numbers
import time

import numpy as np
import tensorflow as tf

from tfsparse import _framework_internal
from tfsparse import dynamic
from tfsparse._keras import keras
from tfsparse._validation import invalid_value as _invalid
from tfsparse.dynamic import selection
from tfsparse.dynamic.update import active_horovod
from tfsparse.dynamic.update import check_optimizer
from tfsparse.dynamic.update import horovod_agreement
from tfsparse.dynamic.update import matrix_shape
from tfsparse.fssl import _layers as _fssl_layers
from tfsparse.layers import SparseConv2D
from tfsparse.layers import SparseDense

METHODS = ("rigl", "set")


class DynamicSparsity(keras.callbacks.Callback):
    """Moves the nonzeros of SparseDense and SparseConv2D layers in training: SET or RigL.

    Every ``update_every`` optimizer steps, until ``end_step``, each layer
    drops the ``f(t) * nnz`` weights of smallest magnitude and grows as many
    positions: RigL (Evci et al. 2020) those where the loss gradient with
    respect to the dense kernel is largest, SET (Mocanu et al. 2018)
    uniformly random ones. ``f(t) = drop_fraction / 2 * (1 + cos(pi t /
    end_step))`` (``decay="cosine"``, RigL's). Grown weights start at 0 and
    their optimizer slots and error-feedback residuals at 0 (Adagrad's and
    Ftrl's accumulators at ``initial_accumulator_value``); surviving weights
    keep theirs (``tfsparse.dynamic.drop_and_grow``). The model trains on the
    nonzeros only all along: the dense gradient RigL needs is formed
    ``block_elements`` entries at a time at update steps only.

    A ``SparseConv2D``'s pattern over its im2col kernel ``(kh * kw * cin,
    filters)`` moves the same way; RigL scores it with the dense kernel
    gradient ``Conv2DBackpropFilter(x, dz)`` (the layer's strides, padding
    and dilations), formed whole: it has the size of the dense kernel.

    RigL's gradient is the one the update step itself computes: the step's
    own batch, its loss (the compiled loss with sample weights, or what a
    custom ``train_step`` differentiates) and the weights before the
    optimizer applies it, as in google-research/rigl. The callback keeps
    each layer's inputs and output gradient of that step
    (``tfsparse.dynamic.StepGradients``, which wraps the model's
    ``train_step`` during ``fit`` and restores it at the end), and forms
    ``x^T dz`` (or its convolution) after the step. Every choice depends only on ``seed``, the
    step (``optimizer.iterations``), the step's batch and the model's state,
    so ``keras.callbacks.BackupAndRestore`` resumes bit-identically: the
    pattern is in the layers' weights.

    Under a ``keras.mixed_precision.LossScaleOptimizer`` a step whose scaled
    gradients overflow is skipped by the optimizer. Where the layers'
    inputs or output gradients RigL keeps overflowed with them, RigL skips
    that step's update too and lists the step in ``skipped_steps``; the
    next update comes ``update_every`` steps later, as after any update.
    (Where they stayed finite, the scaled gradient ranks the positions as
    the unscaled one would: RigL updates.) Without loss scaling a
    non-finite grow gradient is an error.

    Updates run between executions: with ``steps_per_execution > 1`` every
    update step must end one (as it does when ``update_every`` and the steps
    per epoch are multiples of it), else ``fit`` stops with an error.

    Under ``horovodrun`` (Horovod initialized, more than one process) the
    grow gradient is averaged over the ranks block by block and rank 0's new
    pattern is broadcast: all ranks keep the same pattern and weights. With
    ``tfsparse.horovod.DistributedOptimizer`` the residuals of grown
    positions start at 0, those of dropped positions are discarded (their
    weight is gone) and the others follow their weight.

    Args:
      method: "rigl" or "set".
      update_every: int >= 1, steps between updates (RigL: 100).
      drop_fraction: float in (0, 1], ``alpha`` (RigL: 0.3).
      decay: "cosine" (RigL), "constant" or "linear".
      end_step: updates run at steps before it: an int >= 1, or a float in
        (0, 1], the fraction of the training steps, ``epochs`` times the
        steps per epoch of ``fit`` (RigL: 0.75). Training over several
        ``fit`` calls of other lengths needs an int (the steps count on
        over the calls; a fraction that comes to another step in a later
        call is an error). ``fit(initial_epoch=k, epochs=n)`` after an
        interruption comes to the same step as the uninterrupted ``fit``.
      layers: the SparseDense and SparseConv2D layers (or their names) to
        update, each trainable; None for all the trainable ones (a frozen
        layer, ``trainable=False``, keeps its pattern and weights).
      seed: int >= 0, seeds SET's growth.
      block_elements: None or an int >= 1, the most dense-gradient entries
        formed at once (None: 2**23).
      verbose: 0 or 1 (1 prints each update).

    Example:
      >>> import numpy as np
      >>> from tfsparse import SparseDense
      >>> x = np.random.default_rng(0).random((64, 8), "float32")
      >>> y = x.sum(axis=1, keepdims=True)
      >>> model = keras.Sequential([keras.Input((8,)), SparseDense(16, density=0.25,
      ...     seed=0, activation="relu"), SparseDense(1, density=0.5, seed=1)])
      >>> model.compile("adam", "mse")
      >>> callback = DynamicSparsity("rigl", update_every=2)
      >>> _ = model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[callback])
      >>> [update["step"] for update in callback.updates]
      [2, 4]
    """

    def __init__(self, method="rigl", update_every=100, drop_fraction=0.3, decay="cosine",
                 end_step=0.75, layers=None, seed=0, block_elements=None, verbose=0):
        super().__init__()
        errors = []
        if method not in METHODS:
            errors.append(_invalid("method", f"one of {METHODS}", method))
        if not _is_int(update_every) or update_every < 1:
            errors.append(_invalid("update_every", "an integer >= 1", update_every))
        if not _is_real(drop_fraction) or not 0 < drop_fraction <= 1:
            errors.append(_invalid("drop_fraction", "a float in (0, 1]", drop_fraction))
        if decay not in dynamic.schedule.DECAYS:
            errors.append(_invalid("decay", f"one of {dynamic.schedule.DECAYS}", decay))
        if not ((_is_int(end_step) and end_step >= 1)
                or (_is_real(end_step) and not _is_int(end_step) and 0 < end_step <= 1)):
            errors.append(_invalid("end_step", "an integer >= 1 or a float in (0, 1]",
                                   end_step))
        if not _is_int(seed) or seed < 0:
            errors.append(_invalid("seed", "a non-negative integer", seed))
        if block_elements is not None and (not _is_int(block_elements) or block_elements < 1):
            errors.append(_invalid("block_elements", "None or an integer >= 1",
                                   block_elements))
        if verbose not in (0, 1) or not (_is_int(verbose) or isinstance(verbose, bool)):
            errors.append(_invalid("verbose", "0 or 1", verbose))
        selection = layers
        if layers is not None:
            if not isinstance(layers, (str, keras.layers.Layer)) and hasattr(layers, "__iter__"):
                selection = list(layers)
            if not isinstance(selection, list) or not selection:
                errors.append(_invalid("layers", "None or a non-empty list of SparseDense "
                                       "and SparseConv2D layers (or their names)", layers))
        if errors:
            raise ValueError("\n".join(str(error) for error in errors))
        self.method, self.update_every = method, int(update_every)
        self.drop_fraction, self.decay, self.end_step = float(drop_fraction), decay, end_step
        self.layer_selection = selection
        self.seed = int(seed)
        self.block_elements = None if block_elements is None else int(block_elements)
        self.verbose = int(verbose)
        self.updates = []
        self.skipped_steps = []  # RigL's update steps a LossScaleOptimizer skipped
        self._capture = self._installed = None
        self._fraction_end = None  # end_step as a fraction: (model, the step it came to)

    # ---------------------------------------------------------------- Keras hooks
    def on_train_begin(self, logs=None):
        self.updates, self.skipped_steps = [], []
        check_optimizer(self.model.optimizer)  # not at the first update, mid-training
        self._layers = self._resolve_layers()
        self._end = self._end_step()
        step = int(self.model.optimizer.iterations.numpy())
        if (step // self.update_every + 1) * self.update_every < self._end:
            # Only while an update is left (a resume after the last one, into
            # FSSL's pruning, is not a move).
            _refuse_layers_fssl_pruned(self.model, self._layers)
        self._start = self._due = None
        self._epoch_seconds = 0.0
        self._installed = False
        if self.method == "rigl":
            if self.model.jit_compile:
                raise ValueError(
                    "DynamicSparsity('rigl') keeps each layer's inputs and output gradient of "
                    "an update step in variables whose batch size varies, which XLA cannot "
                    "compile: compile the model with jit_compile=False (SET works with XLA). "
                    "Received: jit_compile=True")
            if self._capture is None or self._capture.layers != self._layers:
                self._capture = dynamic.StepGradients(self._layers)
            self._capture.install(self.model)  # traces the step once per compiled model
            self._installed = True

    def on_train_end(self, logs=None):
        if self._installed:
            self._capture.remove(self.model)
            self._installed = False

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_seconds = 0.0

    def on_train_batch_begin(self, batch, logs=None):
        self._start = int(self.model.optimizer.iterations.numpy())
        due = (self._start // self.update_every + 1) * self.update_every
        self._due = due if due < self._end else None
        steps = _framework_internal.steps_per_execution(self.model)
        if self._installed and self._due is not None and due <= self._start + steps:
            self._capture.arm()  # the execution's last step leaves its gradient

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        if self._installed:
            self._capture.disarm()
        if self._due is None or step < self._due:
            return
        if step > self._due:
            raise ValueError(
                f"DynamicSparsity updates between executions, but the update step "
                f"{self._due} fell inside one (steps {self._start + 1}-{step}): compile "
                "with steps_per_execution=1, or make update_every and the steps per "
                "epoch multiples of steps_per_execution.")
        self.update(step, executed=step - self._start)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["dynamic_sparsity/update_seconds"] = self._epoch_seconds

    # ---------------------------------------------------------------- the update
    def update(self, step, executed=1):
        """Runs the drop-and-grow update after ``step`` (``executed`` steps since the last)."""
        start = time.perf_counter()
        fraction = dynamic.drop_fraction_at(step, self.drop_fraction, self._end, self.decay)
        gradients = self._capture.captured(executed) if self.method == "rigl" else None
        hvd = active_horovod()
        if gradients is not None and _overflowed(self.model.optimizer, gradients, hvd):
            self.skipped_steps.append(step)
            if self.verbose:
                print(f"DynamicSparsity step {step}: skipped (the loss-scaled gradients "
                      "overflowed, and the optimizer skipped the step)")
            return
        _refuse_layers_fssl_pruned(self.model, self._layers)
        moved = {}
        for index, layer in enumerate(self._layers):
            agree, average = (horovod_agreement(hvd, f"dynamic_sparsity_{index}")
                              if hvd is not None else (None, None))
            grow = self._grower(step, index, layer, gradients, average)
            moved[layer.name] = dynamic.drop_and_grow(
                layer, fraction, grow, optimizer=self.model.optimizer, agree=agree)
        seconds = time.perf_counter() - start
        self._epoch_seconds += seconds
        self.updates.append(dict(step=step, drop_fraction=fraction, moved=moved,
                                 seconds=seconds))
        if self.verbose:
            print(f"DynamicSparsity step {step}: f={fraction:.4f}, moved {moved} "
                  f"in {seconds:.3f} s")

    def _grower(self, step, index, layer, gradients, average):
        if self.method == "set":
            total = int(np.prod(matrix_shape(layer)))
            rng = np.random.default_rng([self.seed, step, index])
            return lambda taken, count: selection.random_free_keys(rng, total, count, taken)
        inputs, output_gradients = gradients[index]
        if isinstance(layer, SparseConv2D):
            return lambda taken, count: dynamic.largest_conv_gradient_keys(
                layer, inputs, output_gradients, taken, count, average)
        return lambda taken, count: dynamic.largest_gradient_keys(
            inputs, output_gradients, taken, count, self.block_elements, average)

    def _end_step(self):
        if _is_int(self.end_step):
            return int(self.end_step)
        steps = (self.params or {}).get("steps")
        epochs = (self.params or {}).get("epochs")
        if steps and epochs:
            end = int(self.end_step * steps * epochs)
            earlier = self._fraction_end
            if earlier is not None and earlier[0] is self.model and end != earlier[1]:
                # The steps count on over fit calls: another total here would
                # change the schedule halfway, silently.
                raise _invalid(
                    "end_step", "an integer step when fit is called several times with "
                    "different lengths (a fraction is of one fit's steps, "
                    f"epochs x steps per epoch: {earlier[1]} in an earlier fit, "
                    f"{end} in this one)", self.end_step)
            self._fraction_end = (self.model, end)
            return end
        raise ValueError(
            "DynamicSparsity(end_step=<fraction>) needs the number of training steps; "
            "fit without steps_per_epoch on an unsized dataset does not give it: "
            "pass end_step as an integer step.")

    def _resolve_layers(self):
        _refuse_distributed(self.model)
        found = [layer for layer in self.model.submodules
                 if isinstance(layer, (SparseDense, SparseConv2D))]
        if self.layer_selection is not None:
            wanted = [getattr(item, "name", item) for item in self.layer_selection]
            unknown = sorted(set(wanted) - {layer.name for layer in found})
            if unknown:
                raise _invalid("layers", "SparseDense or SparseConv2D layers of the model "
                               "(or their names)", unknown)
            found = [layer for layer in found if layer.name in wanted]
            frozen = [layer.name for layer in found if not layer.trainable]
            if frozen:
                # A frozen layer's grown positions would stay 0 and its
                # dropped weights be lost: its pattern is not to move.
                raise _invalid("layers", "trainable layers (a frozen layer's dropped weights "
                               "would be lost and its grown ones never train)",
                               received=f"trainable=False layers {frozen}")
        else:
            found = [layer for layer in found if layer.trainable]  # frozen ones stay as they are
        if not found:
            raise ValueError(
                "DynamicSparsity found no trainable SparseDense or SparseConv2D layer in the "
                "model (frozen ones, trainable=False, are not updated).")
        return found


def _overflowed(optimizer, gradients, hvd):
    """True when a LossScaleOptimizer's step overflowed: RigL's captured inputs
    or output gradients are not finite on some rank (they feed the step's
    weight gradients, so the optimizer skipped that step)."""
    if not isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer):
        return False
    finite = all(bool(tf.reduce_all(tf.math.is_finite(t))) for pair in gradients for t in pair)
    overflowed = tf.constant(0.0 if finite else 1.0)
    if hvd is not None:  # every rank decides alike
        overflowed = hvd.allreduce(overflowed, op=hvd.Sum, name="dynamic_sparsity_overflow")
    return float(overflowed) > 0


def _refuse_layers_fssl_pruned(model, layers):
    """FSSL's masks hold positions of the pattern it pruned: a move would misplace them."""
    state = getattr(model, "fssl_state", None)
    if state is None or int(state.pruned_epoch.numpy()) < 0:
        return
    moving = {id(layer) for layer in layers}
    for layer, mask in zip(_fssl_layers.regularized_layers(model), state.masks):
        if id(layer) in moving and not bool(tf.reduce_all(mask > 0)):
            raise ValueError(
                f"DynamicSparsity cannot move the pattern of layer {layer.name!r}: FSSL "
                "(callbacks.FSSL) removed groups from it at the end of epoch "
                f"{int(state.pruned_epoch.numpy())}, and its masks hold positions of the "
                "current pattern (a move would zero other weights and let removed groups "
                "grow back). End dynamic sparsity before FSSL prunes (DynamicSparsity's "
                "end_step before FSSL's prune_epoch), or give the two callbacks "
                "different layers.")


def _refuse_distributed(model):
    """Partitioned or pipelined models hold copies of the pattern: refuse them."""
    from tfsparse.partition.distributed import PartitionedSparseDense

    if any(isinstance(layer, PartitionedSparseDense) for layer in model.submodules):
        raise ValueError(
            "DynamicSparsity cannot move the pattern of a row-partitioned model "
            "(tfsparse.partition.distribute): each rank's plan is computed from the "
            "pattern and would go stale. Train the whole model with DynamicSparsity, "
            "then partition it.")
    if model.distribute_strategy.num_replicas_in_sync > 1:
        raise ValueError(
            "DynamicSparsity runs under one replica per process (use horovodrun for "
            "data parallelism); received a model compiled under "
            f"{type(model.distribute_strategy).__name__} with "
            f"{model.distribute_strategy.num_replicas_in_sync} replicas.")
    if getattr(model, "pipeline", None) is not None:
        raise ValueError(
            "DynamicSparsity cannot move the pattern of a model compiled under "
            "tfsparse.distribute.PipelineStrategy: its stages (and partitioned stage "
            "layers) copy the pattern when they are planned and would go stale.")


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
