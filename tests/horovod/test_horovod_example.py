"""examples/horovod_sidco_mnist.py runs end to end (one Horovod process; 2 ranks: make demo)."""

import importlib.util
import json
import pathlib

import pytest

pytest.importorskip("horovod.tensorflow.keras", reason="Horovod is not installed")

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "horovod_sidco_mnist.py"


def load_example():
    spec = importlib.util.spec_from_file_location("horovod_sidco_mnist", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_trains_and_reports(tmp_path):
    example = load_example()
    result = example.main(["--epochs", "2", "--json", str(tmp_path / "result.json"),
                           "--plot", str(tmp_path / "compression.png")])
    with open(tmp_path / "result.json") as handle:
        assert json.load(handle) == result
    assert result["workers"] == 1 and result["compressor"].startswith("SIDCo(ratio=0.01")
    assert result["test_accuracy"] > 0.8  # 2 epochs on 4,000 real digits
    assert result["train_loss"][1] < result["train_loss"][0]
    assert 0 < result["bytes_sent_per_step"] < 0.05 * result["dense_bytes_per_step"]
    assert (tmp_path / "compression.png").stat().st_size > 0
