"""callbacks.FSSL: the penalty / prune / fine-tune schedule inside model.fit."""

import glob
import warnings

import numpy as np
import pytest
import tensorflow as tf

from tfsparse._keras import keras
from callbacks.fssl import FSSL
from tfsparse import fssl
from tfsparse.layers import SparseDense
from tfsparse.regularizers import GroupLasso
from tfsparse.regularizers import group_lasso_terms

TINY_COLUMNS = [0, 3, 5]


def data(seed=0, n=64):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 10)).astype(np.float32)
    return x, (x[:, :2].sum(axis=1, keepdims=True) > 0).astype(np.float32)


def dense_model(l=1e-3):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((10,)),
        keras.layers.Dense(8, "relu", name="hidden", kernel_regularizer=GroupLasso(l)),
        keras.layers.Dense(1, "sigmoid", name="out"),
    ])
    kernel = model.layers[0].kernel.numpy()
    kernel[:, TINY_COLUMNS] *= 1e-4  # columns far under the threshold from the start
    model.layers[0].kernel.assign(kernel)
    model.compile(keras.optimizers.SGD(0.01), "binary_crossentropy")
    return model


def sparse_model():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([
        keras.Input((10,)),
        SparseDense(12, density=0.6, seed=2, activation="relu", name="s1",
                    kernel_regularizer=GroupLasso(1e-3, ("rows", "columns"))),
        SparseDense(6, density=0.6, seed=3, activation="relu", name="s2",
                    kernel_regularizer=GroupLasso(1e-3, "columns") + keras.regularizers.L2(1e-4)),
        keras.layers.Dense(1, "sigmoid", name="out"),
    ])
    for layer, columns in zip(model.layers[:2], ([1, 2, 7], [0, 4])):
        values = layer.values.numpy()
        values[np.isin(layer.pattern.cols, columns)] *= 1e-4
        layer.values.assign(values)
    model.compile(keras.optimizers.Adam(1e-3), "binary_crossentropy")
    return model


def cnn_model():
    """A small functional CNN on (6, 6, 1) images made from the 10 features of ``data``.

    Filters 1 and 4 of "conv" and input channel 2 of "conv2" start far under the
    threshold.
    """
    keras.utils.set_random_seed(2)
    inputs = keras.Input((10,))
    x = keras.layers.Dense(36, "relu", name="embed")(inputs)
    x = keras.layers.Reshape((6, 6, 1))(x)
    x = keras.layers.Conv2D(6, 3, activation="relu", name="conv",
                            kernel_regularizer=GroupLasso(1e-3, ("filters", "shapes")))(x)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Conv2D(4, 3, activation="relu", name="conv2",
                            kernel_regularizer=GroupLasso(1e-3, "channels"))(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, keras.layers.Dense(1, "sigmoid", name="out")(x))
    for name, index in (("conv", np.s_[..., [1, 4]]), ("conv2", np.s_[:, :, 2, :])):
        kernel = model.get_layer(name).kernel.numpy()
        kernel[index] *= 1e-4
        model.get_layer(name).kernel.assign(kernel)
    model.compile(keras.optimizers.Adam(1e-3), "binary_crossentropy")
    return model


def test_conv_groups_are_pruned_masked_and_compacted():
    model = cnn_model()
    weights, params = [w.name for w in model.weights], model.count_params()
    x, y = data(seed=2)
    # Adam moves every weight by about its learning rate per step: the tiny
    # groups (36 weights, 4 steps) stay under a norm of 0.05, the others far above.
    history = model.fit(x, y, epochs=3, batch_size=16, verbose=0,
                        callbacks=[FSSL(threshold=0.05, prune_epoch=1)])
    assert {"fssl/conv/filters", "fssl/conv/shapes", "fssl/conv2/channels"} <= set(
        history.history)
    conv, conv2 = model.get_layer("conv"), model.get_layer("conv2")
    assert model.fssl_state.masks[0].shape == conv.kernel.shape
    np.testing.assert_array_equal(conv.kernel.numpy()[..., [1, 4]], 0)
    np.testing.assert_array_equal(conv2.kernel.numpy()[:, :, 2, :], 0)
    assert history.history["fssl/conv/filters"][-1] == pytest.approx(2 / 6)
    assert history.history["fssl/conv2/channels"][-1] == pytest.approx(1 / 6)
    compacted = fssl.compact(model)  # the Reshape is left intact
    assert compacted.get_layer("conv2").kernel.shape[-2] <= 5
    np.testing.assert_allclose(compacted(x).numpy(), model(x).numpy(), atol=1e-5)
    # The schedule's state is no weight of the (functional) model: before,
    # its masks and counters joined model.weights, count_params counted them
    # and set_weights of a clone refused the longer list.
    assert [w.name for w in model.weights] == weights and model.count_params() == params
    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    np.testing.assert_array_equal(clone(x).numpy(), model(x).numpy())


def test_group_lasso_on_a_transposed_convolution_is_refused():
    model = keras.Sequential([keras.Input((4, 4, 2)), keras.layers.Conv2DTranspose(
        3, 2, name="up", kernel_regularizer=GroupLasso(1e-3, "filters"))])
    model.compile("sgd", "mse")
    with pytest.raises(ValueError) as info:
        model.fit(np.ones((2, 4, 4, 2)), np.ones((2, 5, 5, 3)), verbose=0, callbacks=[FSSL()])
    assert str(info.value) == (
        "FSSL supports GroupLasso on Dense, SparseDense, Conv1D, Conv2D and Conv3D kernels "
        "(convolutions with groups=1). Received: layer 'up' of type Conv2DTranspose with a "
        "GroupLasso kernel_regularizer")


def test_group_lasso_on_a_grouped_convolution_is_refused():
    # Its kernel is (3, 3, in / groups, filters): the channel groups would mix
    # channel k of every group.
    model = keras.Sequential([keras.Input((4, 4, 4)), keras.layers.Conv2D(
        4, 3, groups=2, name="grouped", kernel_regularizer=GroupLasso(1e-3, "channels"))])
    model.compile("sgd", "mse")
    with pytest.raises(ValueError, match="layer 'grouped' of type Conv2D, groups=2 "):
        model.fit(np.ones((2, 4, 4, 4)), np.ones((2, 2, 2, 4)), verbose=0, callbacks=[FSSL()])


@pytest.mark.parametrize("wrapper", [keras.layers.TimeDistributed, keras.layers.Bidirectional])
def test_group_lasso_inside_another_layer_is_refused(wrapper):
    # Before, the wrapped layer was skipped: its penalty stayed in the loss
    # after pruning, its groups never masked.
    inner = (keras.layers.Dense(4, name="wrapped", kernel_regularizer=GroupLasso(0.5))
             if wrapper is keras.layers.TimeDistributed else
             keras.layers.LSTM(2, name="wrapped", kernel_regularizer=GroupLasso(0.5)))
    model = keras.Sequential([keras.Input((3, 6)), wrapper(inner), keras.layers.Flatten(),
                              keras.layers.Dense(1, kernel_regularizer=GroupLasso(0.01))])
    model.compile("sgd", "mse")
    with pytest.raises(ValueError, match="Received: layer '(forward_)?wrapped' of type .* inside another "
                                         "layer"):
        model.fit(np.ones((2, 3, 6)), np.ones((2, 1)), verbose=0, callbacks=[FSSL()])


def test_schedule_prunes_masks_and_turns_the_penalty_off():
    model = dense_model()
    x, y = data()
    callback = FSSL(threshold=1e-2, prune_epoch=2)
    history = model.fit(x, y, epochs=5, batch_size=16, verbose=0, callbacks=[callback])
    logs = history.history
    assert logs["fssl/phase"] == [0.0, 0.0, 1.0, 1.0, 1.0]
    assert callback.pruned_epoch == 1
    kernel = model.layers[0].kernel.numpy()
    norms = np.linalg.norm(kernel, axis=0)
    # The tiny columns were removed at the end of epoch 1 and stayed exactly zero
    # through three fine-tune epochs with a momentum-free SGD that still moves them.
    np.testing.assert_array_equal(kernel[:, TINY_COLUMNS], 0.0)
    assert np.all(norms[np.setdiff1d(np.arange(8), TINY_COLUMNS)] > 1e-2)
    assert logs["fssl/hidden/columns"][-1] == pytest.approx(len(TINY_COLUMNS) / 8)
    assert logs["fssl/group_sparsity"][-1] == pytest.approx(len(TINY_COLUMNS) / 8)
    # Penalty off: the regularisation loss is 0 though the kernel is not.
    assert float(model.layers[0].kernel_regularizer.strength) == 0.0
    assert float(tf.add_n(model.losses)) == 0.0


def test_a_model_reloaded_from_a_saved_model_starts_the_schedule_over(tmp_path):
    # Before: "'_UserObject' object has no attribute 'matches'" (the revived
    # fssl_state) at any fit with FSSL.
    model = dense_model()
    x, y = data()
    model.fit(x, y, epochs=3, batch_size=16, verbose=0,
              callbacks=[FSSL(threshold=1e-2, prune_epoch=2)])
    model.save(tmp_path / "saved", save_format="tf")
    loaded = keras.models.load_model(tmp_path / "saved")
    callback = FSSL(threshold=1e-2, prune_epoch=1)
    history = loaded.fit(x, y, epochs=2, batch_size=16, verbose=0, callbacks=[callback])
    assert history.history["fssl/phase"] == [0.0, 1.0] and callback.pruned_epoch == 0
    np.testing.assert_array_equal(loaded.layers[0].kernel.numpy()[:, TINY_COLUMNS], 0.0)


def test_fine_tune_steps_change_only_kept_weights():
    model = dense_model()
    x, y = data()
    model.fit(x, y, epochs=1, verbose=0, callbacks=[FSSL(threshold=1e-2, prune_epoch=1)])
    before = model.layers[0].kernel.numpy()
    # A second fit restarts the schedule: penalty back on, no masks until it prunes.
    callback = FSSL(threshold=1e-2, prune_epoch=1)
    model.fit(x, y, epochs=2, batch_size=16, verbose=0, callbacks=[callback])
    after = model.layers[0].kernel.numpy()
    assert np.all(after[:, TINY_COLUMNS] == 0)
    kept = np.setdiff1d(np.arange(8), TINY_COLUMNS)
    assert np.all(after[:, kept] != before[:, kept])


def test_second_fit_resets_the_schedule():
    model = dense_model()
    x, y = data()
    callback = FSSL(threshold=1e-2, prune_epoch=1)
    model.fit(x, y, epochs=2, verbose=0, callbacks=[callback])
    assert float(model.layers[0].kernel_regularizer.strength) == 0.0
    seen = {}

    class Probe(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            seen.setdefault("strength", float(model.layers[0].kernel_regularizer.strength))
            seen.setdefault("pruned", callback.pruned_epoch)

    history = model.fit(x, y, epochs=2, verbose=0, callbacks=[callback, Probe()])
    assert seen == {"strength": pytest.approx(1e-3), "pruned": None}
    assert history.history["fssl/phase"] == [0.0, 1.0]


def test_automatic_pruning_when_the_sparsity_stops_changing():
    model = dense_model()
    x, y = data()
    callback = FSSL(threshold=1e-2, prune_epoch=None, patience=2, min_delta=0.0)
    history = model.fit(x, y, epochs=5, verbose=0, callbacks=[callback])
    # Share 3/8 from epoch 0 on: stable at epochs 1 and 2 -> pruned at the end of epoch 2.
    assert history.history["fssl/group_sparsity"][0] == pytest.approx(3 / 8)
    assert callback.pruned_epoch == 2
    assert history.history["fssl/phase"] == [0.0, 0.0, 0.0, 1.0, 1.0]


def test_sparse_dense_rows_and_columns_then_compact_matches():
    model = sparse_model()
    x, y = data(seed=1)
    callback = FSSL(threshold=1e-2, prune_epoch=1)
    history = model.fit(x, y, epochs=3, batch_size=16, verbose=0, callbacks=[callback])
    assert {"fssl/s1/rows", "fssl/s1/columns", "fssl/s2/columns"} <= set(history.history)
    s1, s2 = model.layers[:2]
    for layer, columns in ((s1, [1, 2, 7]), (s2, [0, 4])):
        np.testing.assert_array_equal(layer.values.numpy()[np.isin(layer.pattern.cols, columns)], 0)
    assert all(float(t.strength) == 0 for t in group_lasso_terms(s2.kernel_regularizer))
    # Weight decay (the L2 term of s2's sum) stays on in the fine-tune phase.
    l2 = 1e-4 * float(tf.reduce_sum(tf.square(s2.values)))
    assert float(tf.add_n(model.losses)) == pytest.approx(l2, rel=1e-5)
    compacted = fssl.compact(model)
    assert compacted.layers[0].units <= 12 - 3 and compacted.layers[1].units <= 6 - 2
    np.testing.assert_allclose(compacted(x).numpy(), model(x).numpy(), atol=1e-5)


def test_sparsity_reaches_callbacks_listed_after_fssl():
    model = dense_model()
    x, y = data()
    seen = []

    class Recorder(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append(sorted(key for key in logs if key.startswith("fssl/")))

    model.fit(x, y, epochs=2, verbose=0,
              callbacks=[FSSL(threshold=1e-2, prune_epoch=1), Recorder()])
    assert seen == [["fssl/group_sparsity", "fssl/hidden/columns", "fssl/phase"]] * 2


def test_sparsity_reaches_tensorboard_listed_after_fssl(tmp_path):
    pytest.importorskip("tensorboard", reason="the TensorBoard callback needs the "
                                              "tensorboard package, not installed here")
    model = dense_model()
    x, y = data()
    log_dir = str(tmp_path / "logs")
    model.fit(x, y, epochs=2, verbose=0, callbacks=[
        FSSL(threshold=1e-2, prune_epoch=1), keras.callbacks.TensorBoard(log_dir)])
    tags = set()
    for path in glob.glob(f"{log_dir}/train/events.out.tfevents.*"):
        for record in tf.data.TFRecordDataset(path):
            event = tf.compat.v1.Event.FromString(record.numpy())
            tags.update(value.tag for value in event.summary.value)
    assert {"epoch_fssl/hidden/columns", "epoch_fssl/group_sparsity"} <= tags


def test_no_group_lasso_layer_fails_early():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)], name="plain")
    model.compile("sgd", "mse")
    with pytest.raises(ValueError) as info:
        model.fit(np.ones((4, 3)), np.ones((4, 2)), verbose=0, callbacks=[FSSL()])
    assert str(info.value) == (
        "FSSL found no Dense, SparseDense or convolution layer with a "
        "tfsparse.regularizers.GroupLasso "
        "kernel_regularizer in model 'plain': give the layers to sparsify "
        "kernel_regularizer=GroupLasso(...).")


def test_prune_epoch_beyond_fit_fails_early():
    model = dense_model()
    x, y = data()
    with pytest.raises(ValueError) as info:
        model.fit(x, y, epochs=2, verbose=0, callbacks=[FSSL(prune_epoch=3)])
    assert str(info.value) == ('Received an invalid value for "prune_epoch", expected an '
                               "epoch within fit(epochs=2). Received: prune_epoch=3")


def test_warns_when_never_pruned():
    model = dense_model()
    x, y = data()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, y, epochs=1, verbose=0, callbacks=[FSSL(prune_epoch=None)])
    assert any("before any groups were removed" in str(w.message) for w in caught)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"threshold": -1.0}, 'Received an invalid value for "threshold", expected a finite '
                              "non-negative float. Received: threshold=-1.0"),
        ({"prune_epoch": 0}, 'Received an invalid value for "prune_epoch", expected None or a '
                             "positive integer. Received: prune_epoch=0"),
        ({"patience": 0}, 'Received an invalid value for "patience", expected a positive integer. '
                          "Received: patience=0"),
        ({"min_delta": -0.1}, 'Received an invalid value for "min_delta", expected a finite '
                              "non-negative float. Received: min_delta=-0.1"),
        ({"verbose": 2}, 'Received an invalid value for "verbose", expected one of 0, 1. '
                         "Received: verbose=2"),
    ],
)
def test_invalid_arguments(kwargs, message):
    with pytest.raises(ValueError) as info:
        FSSL(**kwargs)
    assert str(info.value) == message


class _Interrupt(keras.callbacks.Callback):
    """Stops fit as a crash would, at the start of ``epoch``."""

    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            raise KeyboardInterrupt


@pytest.mark.parametrize("prune_epoch", [2, None], ids=["fixed", "automatic"])
@pytest.mark.parametrize("first", ["backup", "fssl"])
@pytest.mark.parametrize("stop", [2, 4])
@pytest.mark.parametrize("make_model", [sparse_model, cnn_model], ids=["sparse", "cnn"])
def test_backup_and_restore_resumes_the_schedule_exactly(tmp_path, prune_epoch, first, stop,
                                                         make_model):
    # Interrupted at the start of epoch ``stop`` (before or after pruning),
    # resumed by BackupAndRestore (listed before or after FSSL, so the backup
    # holds the pruning decision of its epoch or not): the same phases,
    # masks and weights as training without the interruption.
    x, y = data(n=96)
    settings = dict(threshold=0.02, prune_epoch=prune_epoch, patience=1, min_delta=0.5)
    model = make_model()
    straight = FSSL(**settings)
    history = model.fit(x, y, epochs=6, batch_size=32, shuffle=False, verbose=0,
                        callbacks=[straight])
    assert straight.pruned_epoch is not None
    backup = keras.callbacks.BackupAndRestore(str(tmp_path))
    for attempt in (0, 1):
        resumed = make_model()
        callback = FSSL(**settings)
        callbacks = [backup, callback] if first == "backup" else [callback, backup]
        try:
            again = resumed.fit(x, y, epochs=6, batch_size=32, shuffle=False, verbose=0,
                                callbacks=callbacks + ([_Interrupt(stop)] if attempt == 0 else []))
        except KeyboardInterrupt:
            assert attempt == 0
    assert again.history["fssl/phase"] == history.history["fssl/phase"][stop:]
    assert callback.pruned_epoch == straight.pruned_epoch
    # The same float32 operations in the same order: bit for bit.
    for a, b in zip(resumed.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(resumed.fssl_state.masks, model.fssl_state.masks):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_load_weights_and_initial_epoch_continue_the_schedule(tmp_path):
    # A checkpoint of the model after epoch 3 (pruned at epoch 1), loaded
    # into a fresh model and continued with fit(initial_epoch=4): still
    # fine-tuning, the removed groups held at zero.
    x, y = data(n=96)
    model = dense_model(l=1e-2)
    model.fit(x, y, epochs=4, batch_size=32, shuffle=False, verbose=0,
              callbacks=[FSSL(threshold=0.05, prune_epoch=2)])
    model.save_weights(str(tmp_path / "checkpoint"))
    removed = np.flatnonzero(~model.fssl_state.masks[0].numpy().any(axis=0))
    assert set(TINY_COLUMNS) <= set(removed.tolist())
    fresh = dense_model(l=1e-2)
    fresh.load_weights(str(tmp_path / "checkpoint"))  # restores the state on creation
    callback = FSSL(threshold=0.05, prune_epoch=2)
    history = fresh.fit(x, y, epochs=6, initial_epoch=4, batch_size=32, shuffle=False,
                        verbose=0, callbacks=[callback])
    assert history.history["fssl/phase"] == [1.0, 1.0]
    assert callback.pruned_epoch == 1
    assert not fresh.layers[0].kernel.numpy()[:, removed].any()
    assert all(float(term.strength.numpy()) == 0.0
               for term in group_lasso_terms(fresh.layers[0].kernel_regularizer))


def test_removed_groups_stay_zero_after_an_optimizer_with_moving_averages():
    # With use_ema=True Keras writes the weights' moving averages over them
    # once fit ends; those remember the pre-pruning values, so the removed
    # columns came back (about 2e-3) and compact removed nothing.
    model = dense_model()
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9, use_ema=True), "binary_crossentropy")
    x, y = data()
    model.fit(x, y, epochs=3, batch_size=16, verbose=0,
              callbacks=[FSSL(threshold=1e-2, prune_epoch=1)])
    assert np.all(model.layers[0].kernel.numpy()[:, TINY_COLUMNS] == 0)
    assert fssl.compact(model).layers[0].kernel.shape[1] == 8 - len(TINY_COLUMNS)
