"""FSSL: the fine-tuned structured sparsity schedule as a Keras callback."""

import numbers
import warnings

from tfsparse._keras import keras
import tensorflow as tf  # noqa: E402  (after tfsparse._keras selects Keras 2)

from tfsparse import _validation  # noqa: E402
from tfsparse.fssl import _layers  # noqa: E402
from tfsparse.regularizers import group_lasso_terms  # noqa: E402
from tfsparse.regularizers import group_sparsity  # noqa: E402


class FSSL(keras.callbacks.Callback):
    """Train with a group penalty, remove the groups it zeroed, fine-tune without it.

    The model's Dense, SparseDense and Conv1D/2D/3D layers whose
    ``kernel_regularizer`` holds a ``tfsparse.regularizers.GroupLasso`` take
    part (for convolutions the groups are filters, channels, shapes or
    blocks, and the masks have the kernel's shape). The schedule:

    1. Penalty phase: ``fit`` trains with the group lasso in the loss.
    2. Pruning, at the end of epoch ``prune_epoch - 1`` (or, with
       ``prune_epoch=None``, once the share of groups whose norm is at most
       ``threshold`` is above 0 and has changed by at most ``min_delta`` for
       ``patience`` consecutive epochs): every such group is set to exactly
       zero and masked, i.e. re-zeroed after every training batch from then
       on; and the GroupLasso strengths (their ``strength`` variables, read by
       the compiled training step) are set to 0.
    3. Fine-tune phase: the remaining epochs train without the penalty, the
       removed groups held at zero. ``tfsparse.fssl.compact(model)`` then
       removes them physically.

    At every epoch end it adds to the logs ``fssl/<layer>/<kind>`` (the share
    of the layer's groups of that kind with norm <= ``threshold``, measured
    after that epoch's pruning, if any), ``fssl/group_sparsity`` (over all
    groups) and ``fssl/phase`` (the phase the epoch trained in: 0 penalty,
    1 fine-tune). The History records them, and so does a ``TensorBoard``
    callback listed after this one in ``callbacks`` (Keras calls callbacks in
    list order). With ``steps_per_execution > 1`` the masks are re-applied
    every ``steps_per_execution`` batches.

    The schedule's state (the masks, the epoch the groups were removed at,
    the automatic rule's counters) lives in variables tracked by the model
    (``model.fssl_state``, outside ``model.weights``), so TensorFlow
    checkpoints of the model carry it: ``keras.callbacks.BackupAndRestore``
    or ``model.save_weights`` / ``load_weights`` in the TensorFlow format with
    ``fit(initial_epoch=...)`` resume the schedule where it stopped (penalty
    off and masks on after the pruning epoch; a pruning decision the
    checkpoint missed is taken at the resume). ``.h5`` weights files and
    ``.keras`` files hold only the layers' weights, not this state. A ``fit``
    from epoch 0 starts the schedule again.

    Args:
        threshold: float >= 0, the group norm at or under which a group is removed.
        prune_epoch: int >= 1, the epoch (0-based, as Keras counts) at which
            fine-tuning starts; None to decide from the sparsity (see above).
        patience: int >= 1, epochs of stable sparsity before automatic pruning.
        min_delta: float >= 0, the largest change of the sparsity share between
            epochs that counts as stable.
        verbose: 0 or 1; 1 prints when the groups are removed.

    Example:
        >>> import numpy as np
        >>> from tfsparse.regularizers import GroupLasso
        >>> model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(
        ...     16, activation="relu", kernel_regularizer=GroupLasso(0.01)),
        ...     keras.layers.Dense(1)])
        >>> model.compile("adam", "mse")
        >>> x, y = np.ones((32, 8), "float32"), np.ones((32, 1), "float32")
        >>> history = model.fit(x, y, epochs=3, verbose=0,
        ...                     callbacks=[FSSL(threshold=1e-2, prune_epoch=2)])
        >>> history.history["fssl/phase"]
        [0.0, 0.0, 1.0]
    """

    def __init__(self, threshold=1e-3, prune_epoch=None, patience=2, min_delta=0.0, verbose=0):
        super().__init__()
        self.threshold = _validation.check_non_negative_float("threshold", threshold)
        if prune_epoch is not None and (
                isinstance(prune_epoch, bool) or not isinstance(prune_epoch, numbers.Integral)
                or prune_epoch < 1):
            raise _validation.invalid_value("prune_epoch", "None or a positive integer",
                                            prune_epoch)
        self.patience = _validation.check_positive_int("patience", patience)
        self.min_delta = _validation.check_non_negative_float("min_delta", min_delta)
        self.verbose = _validation.check_choice("verbose", verbose, (0, 1))
        self.prune_epoch = prune_epoch
        self._reset()

    def _reset(self):
        self.layers = []
        self._apply_masks = None
        self._first_epoch = True

    @property
    def pruned_epoch(self):
        """The epoch at whose end the groups were removed; None before."""
        state = getattr(self.model, "fssl_state", None) if self.model is not None else None
        epoch = -1 if state is None else int(state.pruned_epoch.numpy())
        return None if epoch < 0 else epoch

    # Keras hooks.
    def on_train_begin(self, logs=None):
        self._reset()
        self.layers = _layers.regularized_layers(self.model)
        if not self.layers:
            raise ValueError(
                "FSSL found no Dense, SparseDense or convolution layer with a "
                "tfsparse.regularizers.GroupLasso kernel_regularizer in model "
                f"{self.model.name!r}: give the layers to sparsify "
                "kernel_regularizer=GroupLasso(...)."
            )
        epochs = (self.params or {}).get("epochs")
        if self.prune_epoch is not None and epochs is not None and self.prune_epoch > epochs:
            raise _validation.invalid_value(
                "prune_epoch", f"an epoch within fit(epochs={epochs})", self.prune_epoch)
        variables = [_layers.kernel_variable(layer) for layer in self.layers]
        state = getattr(self.model, "fssl_state", None)
        # Not an FSSLState: a SavedModel's revived copy (keras.models.load_model
        # of a SavedModel directory) holds values but no methods; the schedule
        # starts over, as after a .keras file.
        if not isinstance(state, FSSLState) or not state.matches(variables):
            # Tracked by the model: a checkpoint restored before or after
            # this (BackupAndRestore in either order) fills it.
            self.model.fssl_state = FSSLState(variables)
        self._state = self.model.fssl_state

    def on_epoch_begin(self, epoch, logs=None):
        if not self._first_epoch:
            return
        self._first_epoch = False
        state = self._state
        if epoch == 0:
            state.reset()
        elif int(state.processed_epoch.numpy()) < epoch - 1:
            # The checkpoint was written before this callback's end of epoch
            # ``epoch - 1`` (BackupAndRestore listed first): decide it now,
            # on the weights that epoch ended with.
            self._end_epoch(epoch - 1)
        pruned = int(state.pruned_epoch.numpy()) >= 0
        for term in self._terms():
            term.strength.assign(0.0 if pruned else term.l)
        if pruned:
            self._use_masks()

    def on_train_batch_end(self, batch, logs=None):
        if self._apply_masks is not None:
            self._apply_masks()

    def on_epoch_end(self, epoch, logs=None):
        shares, share = self._end_epoch(epoch)
        if logs is not None:
            logs.update(shares)
            logs["fssl/group_sparsity"] = share
            pruned_epoch = self.pruned_epoch
            trained_without_penalty = pruned_epoch is not None and epoch > pruned_epoch
            logs["fssl/phase"] = 1.0 if trained_without_penalty else 0.0

    def on_train_end(self, logs=None):
        # Keras has just finalized the optimizer: with use_ema=True it wrote
        # the weights' moving averages, which remember pre-pruning values,
        # over the weights (the removed groups came back, and compact then
        # removed nothing).
        if self._apply_masks is not None:
            self._apply_masks()
        if self.pruned_epoch is None:
            warnings.warn(
                "FSSL: training ended before any groups were removed (no epoch met the "
                "pruning rule); the model is still in the penalty phase.", stacklevel=2)

    # The schedule.
    def _terms(self):
        return [term for layer in self.layers
                for term in group_lasso_terms(layer.kernel_regularizer)]

    def group_sparsity(self):
        """``({"fssl/<layer>/<kind>": share}, overall share)`` of groups at or under threshold."""
        shares, under, total = {}, 0.0, 0
        for layer in self.layers:
            kinds, block_shape = _layers.group_settings(layer)
            for kind in kinds:
                norms = _layers.group_norms_of(layer, kind, block_shape)
                share = float(group_sparsity(norms, self.threshold))
                shares[f"fssl/{layer.name}/{kind}"] = share
                under += share * int(norms.shape[0])
                total += int(norms.shape[0])
        return shares, (under / total if total else 0.0)

    def _end_epoch(self, epoch):
        """The pruning rule at the end of ``epoch``; returns ``group_sparsity()``."""
        shares, share = self.group_sparsity()
        if self.pruned_epoch is None and self._should_prune(epoch, share):
            self._prune(epoch)
            shares, share = self.group_sparsity()
        self._state.processed_epoch.assign(epoch)
        return shares, share

    def _should_prune(self, epoch, share):
        if self.prune_epoch is not None:
            return epoch + 1 >= self.prune_epoch
        state = self._state
        previous = float(state.previous_share.numpy())
        state.previous_share.assign(share)
        first = previous != previous  # NaN: no earlier epoch to compare with
        if not first and share > 0 and abs(share - previous) <= self.min_delta:
            state.stable_epochs.assign_add(1)
        else:
            state.stable_epochs.assign(0)
        return int(state.stable_epochs.numpy()) >= self.patience

    def _prune(self, epoch):
        state = self._state
        for layer, mask in zip(self.layers, state.masks):
            kinds, block_shape = _layers.group_settings(layer)
            mask.assign(tf.cast(_layers.keep_mask_of(layer, kinds, self.threshold, block_shape),
                                mask.dtype))
        state.pruned_epoch.assign(epoch)
        self._use_masks()
        for term in self._terms():
            term.strength.assign(0.0)
        if self.verbose:
            print(f"FSSL: removed groups with norm <= {self.threshold:g} at the end of "
                  f"epoch {epoch + 1}; fine-tuning without the group penalty.")

    def _use_masks(self):
        """Zeroes the removed groups now and after every training batch."""
        pairs = [(_layers.kernel_variable(layer), mask)
                 for layer, mask in zip(self.layers, self._state.masks)]

        @tf.function
        def apply_masks():
            for variable, mask in pairs:
                variable.assign(variable * mask)

        apply_masks()
        self._apply_masks = apply_masks


class FSSLState(tf.__internal__.tracking.AutoTrackable):
    """The FSSL schedule's state, as variables a model checkpoint carries.

    ``masks`` (one 0/1 variable per regularised layer, the shape of its
    kernel variable), ``pruned_epoch`` (-1 before pruning),
    ``processed_epoch`` (the last epoch whose end the schedule handled),
    ``previous_share`` and ``stable_epochs`` (the automatic rule's counters).

    AutoTrackable, not a ``tf.Module``: assigned to a functional model's
    attribute, a module's variables join ``model.weights`` (so
    ``get_weights``, ``set_weights`` into a clone, ``count_params``);
    this is a checkpoint dependency only.
    """

    def __init__(self, kernels):
        super().__init__()
        self.masks = [tf.Variable(tf.ones(v.shape, v.dtype), trainable=False,
                                  name=f"mask_{i}") for i, v in enumerate(kernels)]
        self.pruned_epoch = tf.Variable(-1, dtype=tf.int64, trainable=False)
        self.processed_epoch = tf.Variable(-1, dtype=tf.int64, trainable=False)
        self.previous_share = tf.Variable(float("nan"), dtype=tf.float64, trainable=False)
        self.stable_epochs = tf.Variable(0, dtype=tf.int64, trainable=False)

    def matches(self, kernels):
        """Whether the masks fit these kernel variables (the same layers)."""
        return (len(self.masks) == len(kernels)
                and all(m.shape == v.shape and m.dtype == v.dtype
                        for m, v in zip(self.masks, kernels)))

    def reset(self):
        """A new schedule: no masks, not pruned, counters cleared."""
        for mask in self.masks:
            mask.assign(tf.ones_like(mask))
        self.pruned_epoch.assign(-1)
        self.processed_epoch.assign(-1)
        self.previous_share.assign(float("nan"))
        self.stable_epochs.assign(0)
