"""CompressionMonitor: History, batch logs, TensorBoard, PNG plot, misuse, reset."""

import glob

import numpy as np
import pytest
import tensorflow as tf

from callbacks.compression_monitor import LOG_KEYS
from callbacks.compression_monitor import CompressionMonitor
from tfsparse import keras
from tfsparse.compression import SIDCo
hvd = pytest.importorskip("horovod.tensorflow.keras", reason="Horovod is not installed")

from tfsparse.horovod import DistributedOptimizer  # noqa: E402  (needs Horovod)


@pytest.fixture(scope="module", autouse=True)
def horovod():
    hvd.init()


def model_and_data(optimizer=None):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.layers.Dense(8, activation="relu", input_shape=(6,)),
                              keras.layers.Dense(1)])
    if optimizer is None:
        optimizer = DistributedOptimizer(keras.optimizers.SGD(0.05), compression=SIDCo(0.1))
    model.compile(optimizer, "mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 6)).astype(np.float32)
    return model, x, x[:, :1] - x[:, 1:2]


def test_epoch_values_reach_the_history():
    model, x, y = model_and_data()
    monitor = CompressionMonitor()
    history = model.fit(x, y, epochs=3, batch_size=16, verbose=0, callbacks=[monitor])
    for key in LOG_KEYS:
        assert len(history.history[key]) == 3, key
    stats = model.optimizer.compression_stats
    # The last epoch: 6 steps; ratios of sums over them.
    assert history.history["compression_bytes_sent"][-1] > 0
    assert history.history["compression_dense_bytes"][-1] == 4 * 65
    assert history.history["compression_bytes_ratio"][-1] == pytest.approx(
        history.history["compression_bytes_sent"][-1] / (4 * 65))
    total_sent = float(stats["total_bytes_sent"].numpy())
    assert sum(history.history["compression_bytes_sent"]) * 6 == pytest.approx(total_sent)
    assert history.history["compression_achieved_ratio"][-1] == pytest.approx(
        history.history["compression_bytes_sent"][-1] / 8 / 65)
    assert monitor.epochs[-1]["compression_quality"] == history.history["compression_quality"][-1]


def test_batch_values_reach_the_batch_logs_and_the_plot(tmp_path):
    model, x, y = model_and_data()
    seen = []
    recorder = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: seen.append(dict(logs)))
    plot = tmp_path / "plots" / "compression.png"
    monitor = CompressionMonitor(update_freq="batch", plot_path=str(plot))
    model.fit(x, y, epochs=2, batch_size=16, verbose=0, callbacks=[monitor, recorder])
    assert len(seen) == 12 and len(monitor.steps) == 12
    for logs, record in zip(seen, monitor.steps):
        for key in LOG_KEYS:
            assert logs[key] == record[key]
    assert seen[-1]["compression_bytes_sent"] == float(
        model.optimizer.compression_stats["bytes_sent"].numpy())
    with open(plot, "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"


def test_batch_values_come_from_the_batches_that_exchanged():
    # backward_passes_per_step=2: the passes that only sum locally reported
    # the previous exchange's values again (the first, zeros).
    model, x, y = model_and_data(DistributedOptimizer(
        keras.optimizers.SGD(0.05), compression=SIDCo(0.1), backward_passes_per_step=2))
    seen = []
    recorder = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: seen.append(dict(logs)))
    monitor = CompressionMonitor(update_freq="batch")
    model.fit(x, y, epochs=1, batch_size=16, verbose=0, callbacks=[monitor, recorder])
    assert len(seen) == 6 and len(monitor.steps) == 3
    assert [("compression_bytes_sent" in logs) for logs in seen] == [False, True] * 3
    assert all(record["compression_bytes_sent"] > 0 for record in monitor.steps)


def test_tensorboard_listed_after_the_monitor_writes_the_values(tmp_path):
    pytest.importorskip("tensorboard", reason="tf.summary needs the tensorboard package, not installed")
    model, x, y = model_and_data()
    board = keras.callbacks.TensorBoard(log_dir=str(tmp_path), update_freq="epoch")
    model.fit(x, y, epochs=2, batch_size=16, verbose=0, callbacks=[CompressionMonitor(), board])
    tags = set()
    for path in glob.glob(str(tmp_path / "train" / "events.out.tfevents.*")):
        for record in tf.data.TFRecordDataset(path):
            event = tf.compat.v1.Event.FromString(record.numpy())
            tags.update(value.tag for value in event.summary.value)
    assert {"epoch_" + key for key in LOG_KEYS} <= tags


def test_second_fit_starts_afresh():
    model, x, y = model_and_data()
    monitor = CompressionMonitor(update_freq="batch")
    model.fit(x, y, epochs=2, batch_size=16, verbose=0, callbacks=[monitor])
    model.fit(x, y, epochs=1, batch_size=16, verbose=0, callbacks=[monitor])
    assert len(monitor.epochs) == 1 and len(monitor.steps) == 6


def test_fails_early_without_a_distributed_optimizer():
    model, x, y = model_and_data(keras.optimizers.SGD(0.1))
    with pytest.raises(ValueError, match="needs a model compiled with tfsparse.horovod.DistributedOptimizer. "
                                         "Received optimizer: SGD"):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[CompressionMonitor()])


def test_invalid_arguments():
    with pytest.raises(ValueError) as info:
        CompressionMonitor(update_freq=5)
    assert str(info.value) == ('Received an invalid value for "update_freq", expected one of '
                               "'epoch', 'batch'. Received: update_freq=5")
    with pytest.raises(ValueError) as info:
        CompressionMonitor(plot_path="plot.pdf")
    assert str(info.value) == ('Received an invalid value for "plot_path", expected a path '
                               "ending in '.png' or None. Received: plot_path='plot.pdf'")
