"""DynamicSparsity: SET and RigL drop-and-grow updates of SparseDense layers in fit."""

import numbers
import time

import numpy as np

from tfsparse._keras import keras
from tfsparse import dynamic
from tfsparse._validation import invalid_value as _invalid
from tfsparse.dynamic import selection
from tfsparse.dynamic.update import active_horovod
from tfsparse.dynamic.update import horovod_agreement
from tfsparse.layers import SparseDense

METHODS = ("rigl", "set")


class DynamicSparsity(keras.callbacks.Callback):
    """Moves the nonzeros of SparseDense layers during training: SET or RigL.

    Every ``update_every`` optimizer steps, until ``end_step``, each layer
    drops the ``f(t) * nnz`` weights of smallest magnitude and grows as many
    positions: RigL (Evci et al. 2020) those where the loss gradient with
    respect to the dense kernel is largest, SET (Mocanu et al. 2018)
    uniformly random ones. ``f(t) = drop_fraction / 2 * (1 + cos(pi t /
    end_step))`` (``decay="cosine"``, RigL's). Grown weights start at 0 and
    their optimizer slots and error-feedback residuals at 0; surviving weights
    keep theirs (``tfsparse.dynamic.drop_and_grow``). The model trains on the
    nonzeros only all along: the dense gradient RigL needs is formed
    ``block_elements`` entries at a time at update steps only.

    RigL's gradient is taken on a batch of ``data``, the training set passed
    again: at step ``t`` the ``batch_size`` rows drawn by a generator seeded
    with ``(seed, t)``. (A Keras callback does not see the step's own batch;
    a random training batch is what that batch is, statistically.) Every
    choice depends only on ``seed``, the step (``optimizer.iterations``) and
    the model's state, so ``keras.callbacks.BackupAndRestore`` resumes
    bit-identically: the pattern is in the layers' weights.

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
      end_step: last update step: an int >= 1, or a float in (0, 1], the
        fraction of the training steps (RigL: 0.75).
      layers: the SparseDense layers (or their names) to update; None for all.
      data: ``(x, y)`` arrays of training data, required for RigL.
      batch_size: rows of ``data`` per RigL gradient.
      seed: int, seeds SET's growth and RigL's batches.
      loss: RigL's loss; None for the model's compiled loss.
      block_elements: int, the most dense-gradient entries formed at once.
      verbose: 0 or 1 (1 prints each update).

    Example:
      >>> import numpy as np
      >>> from tfsparse import SparseDense
      >>> x = np.random.default_rng(0).random((64, 8), "float32")
      >>> y = x.sum(axis=1, keepdims=True)
      >>> model = keras.Sequential([keras.Input((8,)), SparseDense(16, density=0.25,
      ...     seed=0, activation="relu"), SparseDense(1, density=0.5, seed=1)])
      >>> model.compile("adam", "mse")
      >>> callback = DynamicSparsity("rigl", update_every=2, data=(x, y), batch_size=16)
      >>> _ = model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[callback])
      >>> [update["step"] for update in callback.updates]
      [2, 4]
    """

    def __init__(self, method="rigl", update_every=100, drop_fraction=0.3, decay="cosine",
                 end_step=0.75, layers=None, data=None, batch_size=128, seed=0, loss=None,
                 block_elements=None, verbose=0):
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
        if method == "rigl" and (not isinstance(data, (tuple, list)) or len(data) != 2):
            errors.append(_invalid("data", "(x, y) training arrays for RigL's gradient",
                                   received=f"data of type {type(data).__name__}"))
        if not _is_int(batch_size) or batch_size < 1:
            errors.append(_invalid("batch_size", "an integer >= 1", batch_size))
        if not _is_int(seed):
            errors.append(_invalid("seed", "an integer", seed))
        if errors:
            raise ValueError("\n".join(str(error) for error in errors))
        self.method, self.update_every = method, int(update_every)
        self.drop_fraction, self.decay, self.end_step = float(drop_fraction), decay, end_step
        self.layer_selection, self.data, self.batch_size = layers, data, int(batch_size)
        self.seed, self.loss, self.block_elements = int(seed), loss, block_elements
        self.verbose = verbose
        self.updates = []

    # ---------------------------------------------------------------- Keras hooks
    def on_train_begin(self, logs=None):
        self.updates = []
        self._layers = self._resolve_layers()
        self._last_step = self._end = None
        steps = (self.params or {}).get("steps")
        epochs = (self.params or {}).get("epochs")
        if _is_int(self.end_step):
            self._end = int(self.end_step)
        elif steps and epochs:
            self._end = int(self.end_step * steps * epochs)
        else:
            raise ValueError(
                "DynamicSparsity(end_step=<fraction>) needs the number of training steps; "
                "fit without steps_per_epoch on an unsized dataset does not give it: "
                "pass end_step as an integer step.")
        self._epoch_seconds = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_seconds = 0.0

    def on_train_batch_begin(self, batch, logs=None):
        self._last_step = int(self.model.optimizer.iterations.numpy())

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        if self._last_step is not None and step - self._last_step != 1:
            raise ValueError(
                "DynamicSparsity updates between single steps: compile the model "
                f"with steps_per_execution=1. Received: {step - self._last_step} "
                "steps per execution")
        if step % self.update_every == 0 and 0 < step < self._end:
            self.update(step)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["dynamic_sparsity/update_seconds"] = self._epoch_seconds

    # ---------------------------------------------------------------- the update
    def update(self, step):
        """Runs the drop-and-grow update of ``step`` on every layer."""
        start = time.perf_counter()
        fraction = dynamic.drop_fraction_at(step, self.drop_fraction, self._end, self.decay)
        gradients = self._gradients(step) if self.method == "rigl" else None
        hvd = active_horovod()
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
        total = layer.input_dim * layer.units
        if self.method == "set":
            rng = np.random.default_rng([self.seed, step, index])
            return lambda taken, count: selection.random_free_keys(rng, total, count, taken)
        inputs, output_gradients = gradients[index]
        return lambda taken, count: dynamic.largest_gradient_keys(
            inputs, output_gradients, taken, count, self.block_elements, average)

    def _gradients(self, step):
        x, y = self.data
        rng = np.random.default_rng([self.seed, step])
        rows = np.sort(rng.choice(len(x), size=min(self.batch_size, len(x)), replace=False))
        return dynamic.layer_gradients(self.model, self._layers, np.asarray(x)[rows],
                                       np.asarray(y)[rows], loss=self.loss)

    def _resolve_layers(self):
        _refuse_distributed(self.model)
        found = [layer for layer in self.model.submodules if isinstance(layer, SparseDense)]
        if self.layer_selection is not None:
            wanted = [getattr(item, "name", item) for item in self.layer_selection]
            unknown = sorted(set(wanted) - {layer.name for layer in found})
            if unknown:
                raise _invalid("layers", "SparseDense layers of the model (or their names)",
                               unknown)
            found = [layer for layer in found if layer.name in wanted]
        if not found:
            raise ValueError("DynamicSparsity found no SparseDense layer in the model.")
        return found


def _refuse_distributed(model):
    """Partitioned or pipelined models hold copies of the pattern: refuse them."""
    from tfsparse.partition.distributed import PartitionedSparseDense

    if any(isinstance(layer, PartitionedSparseDense) for layer in model.submodules):
        raise ValueError(
            "DynamicSparsity cannot move the pattern of a row-partitioned model "
            "(tfsparse.partition.distribute): each rank's plan is computed from the "
            "pattern and would go stale. Train the whole model with DynamicSparsity, "
            "then partition it.")
    if getattr(model, "pipeline", None) is not None:
        raise ValueError(
            "DynamicSparsity cannot move the pattern of a model compiled under "
            "tfsparse.distribute.PipelineStrategy: its stages (and partitioned stage "
            "layers) copy the pattern when they are planned and would go stale.")


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
