"""CompressionMonitor: what the compressed gradient exchange did, in the training logs."""

import os

from tfsparse._keras import keras
from tfsparse._keras import unwrap_loss_scaling
from tfsparse._validation import check_choice
from tfsparse._validation import invalid_value

# Keys added to the logs, and the statistic each one reports.
LOG_KEYS = {
    "compression_achieved_ratio": "sent elements / gradient elements",
    "compression_quality": "sent elements / target elements (estimation quality)",
    "compression_stages": "mean stage count of the compressors (0 if they have none)",
    "compression_time": "seconds per step spent compressing (incl. error feedback)",
    "compression_bytes_sent": "payload bytes sent per step by this rank (values + indices)",
    "compression_dense_bytes": "bytes per step a dense allreduce would reduce",
    "compression_bytes_ratio": "bytes sent / dense bytes",
}
_FREQUENCIES = ("epoch", "batch")


class CompressionMonitor(keras.callbacks.Callback):
    """Records the statistics of `tfsparse.horovod.DistributedOptimizer` while training.

    Per epoch (always) and per batch (``update_freq="batch"``; only the
    batches that exchanged gradients: with ``backward_passes_per_step=N``
    every N-th) it adds to the logs the keys of `LOG_KEYS`: achieved ratio, estimation quality
    (achieved/target), stages, compression time, and bytes sent against the
    bytes of a dense allreduce. Epoch values are means over the epoch's steps
    (ratios of sums). Keras' `History` therefore holds them
    (``history.history["compression_quality"]``), and a
    `keras.callbacks.TensorBoard` listed after this callback writes them as
    scalars. The per-step and per-epoch records are also kept in
    ``monitor.steps`` and ``monitor.epochs``; with ``plot_path`` a PNG of
    estimation quality and bytes over training is saved at the end.

    Args:
        update_freq: "epoch" or "batch" (also add per-batch values to the batch logs).
        plot_path: optional path of a PNG plot written when training ends.

    Example:
        >>> from callbacks.compression_monitor import CompressionMonitor
        >>> monitor = CompressionMonitor(update_freq="batch", plot_path="compression.png")
    """

    def __init__(self, update_freq="epoch", plot_path=None):
        super().__init__()
        check_choice("update_freq", update_freq, _FREQUENCIES)
        if plot_path is not None and not str(plot_path).lower().endswith(".png"):
            raise invalid_value("plot_path", "a path ending in '.png' or None", plot_path)
        self.update_freq = update_freq
        self.plot_path = None if plot_path is None else os.fspath(plot_path)
        self.steps = []
        self.epochs = []
        self._stats = None
        self._epoch_start = None

    def _read(self):
        return {key: float(variable.numpy()) for key, variable in self._stats.items()}

    def on_train_begin(self, logs=None):
        optimizer = unwrap_loss_scaling(getattr(self.model, "optimizer", None))
        stats = getattr(optimizer, "compression_stats", None)
        if stats is None:
            raise ValueError(
                "CompressionMonitor needs a model compiled with "
                "tfsparse.horovod.DistributedOptimizer. Received optimizer: "
                f"{type(optimizer).__name__ if optimizer is not None else None}"
            )
        self._stats = stats
        self.steps = []
        self.epochs = []
        self._exchanges = self._read()["steps"]

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = self._read()

    def on_train_batch_end(self, batch, logs=None):
        if self.update_freq != "batch" and self.plot_path is None:
            return
        stats = self._read()
        if stats["steps"] == self._exchanges:
            return  # a pass that summed its gradient locally: nothing new to report
        self._exchanges = stats["steps"]
        record = {
            "compression_achieved_ratio": stats["achieved_ratio"],
            "compression_quality": stats["estimation_quality"],
            "compression_stages": stats["stages"],
            "compression_time": stats["compression_time"],
            "compression_bytes_sent": stats["bytes_sent"],
            "compression_dense_bytes": stats["dense_bytes"],
            "compression_bytes_ratio": stats["bytes_sent"] / max(stats["dense_bytes"], 1.0),
        }
        self.steps.append(record)
        if self.update_freq == "batch" and isinstance(logs, dict):
            logs.update(record)

    def on_epoch_end(self, epoch, logs=None):
        now, start = self._read(), self._epoch_start
        delta = {key: now[key] - start[key] for key in now if key.startswith("total_") or key == "steps"}
        steps = max(delta["steps"], 1.0)
        record = {
            "compression_achieved_ratio": delta["total_selected"] / max(delta["total_elements"], 1.0),
            "compression_quality": delta["total_selected"] / max(delta["total_target"], 1.0),
            "compression_stages": now["stages"],
            "compression_time": delta["total_compression_time"] / steps,
            "compression_bytes_sent": delta["total_bytes_sent"] / steps,
            "compression_dense_bytes": delta["total_dense_bytes"] / steps,
            "compression_bytes_ratio": delta["total_bytes_sent"] / max(delta["total_dense_bytes"], 1.0),
        }
        self.epochs.append(record)
        if logs is not None:
            logs.update(record)

    def on_train_end(self, logs=None):
        if self.plot_path is not None and self.steps:
            plot_compression(self.steps, self.plot_path)


def plot_compression(records, path):
    """Saves a PNG of estimation quality and bytes per step (records: per-step dicts)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    steps = range(1, len(records) + 1)
    figure, (quality_axis, bytes_axis) = pyplot.subplots(2, 1, figsize=(7, 6), sharex=True)
    quality_axis.plot(steps, [r["compression_quality"] for r in records], label="achieved / target")
    quality_axis.axhline(1.0, color="gray", linestyle="--", linewidth=1)
    quality_axis.set_ylabel("estimation quality")
    quality_axis.legend()
    bytes_axis.plot(steps, [r["compression_bytes_sent"] for r in records], label="sent (values + indices)")
    bytes_axis.plot(steps, [r["compression_dense_bytes"] for r in records], label="dense allreduce")
    bytes_axis.set_yscale("log")
    bytes_axis.set_ylabel("bytes per step")
    bytes_axis.set_xlabel("step")
    bytes_axis.legend()
    figure.tight_layout()
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
