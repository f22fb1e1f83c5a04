"""python -m tfsparse.partition: table, chart, saved partitions, saved models."""

import subprocess
import sys

import pytest

from tfsparse._keras import keras
from tfsparse.layers import SparseDense
from tfsparse.partition import Partition
from tfsparse.partition.__main__ import main


def test_radixnet_comparison_table_chart_and_partitions(tmp_path, capsys):
    chart = tmp_path / "chart.png"
    code = main(["--neurons", "64", "--layers", "3", "-k", "2", "4",
                 "--plot", str(chart), "--save-dir", str(tmp_path / "parts"),
                 "--relabel", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0
    assert "RadiX-Net 64x3, relabelled at random: 6144 edges" in out
    rows = [line for line in out.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + 8  # header + 2 k x 4 methods
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = Partition.load(tmp_path / "parts" / "partition-hypergraph-k4.npz")
    assert saved.k == 4 and saved.sizes == [64] * 4
    assert f"| 4 | hypergraph | {saved.volume} |" in out


def save_sparse_model(directory, widths, density):
    """Saves a chain of SparseDense layers (``widths[0]`` inputs) as model.keras."""
    model = keras.Sequential(
        [keras.Input((widths[0],))]
        + [SparseDense(width, density=density, seed=index)
           for index, width in enumerate(widths[1:])])
    path = directory / "model.keras"
    model.save(path)
    return model, path


def test_saved_model_and_errors(tmp_path, capsys):
    model, path = save_sparse_model(tmp_path, (12, 10, 8), 0.4)
    code = main(["--model", str(path), "-k", "2", "--methods", "block",
                 "random", "--plot", str(tmp_path / "m.png"), "--no-progress"])
    out = capsys.readouterr().out
    edges = sum(layer.nnz for layer in model.layers)
    names = ", ".join(layer.name for layer in model.layers)
    assert code == 0
    assert f"model model.keras, SparseDense layers {names}: {edges} edges" in out
    assert main(["--model", str(path), "-k", "9", "--plot",
                 str(tmp_path / "x.png"), "--no-progress"]) == 2
    assert 'invalid value for "k"' in capsys.readouterr().err


def test_module_runs_as_a_command(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "tfsparse.partition", "--neurons", "32",
         "--layers", "2", "-k", "2", "--methods", "block", "--plot",
         str(tmp_path / "c.png"), "--no-progress"],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| 2 | block |" in done.stdout


def test_saved_model_with_a_dense_classifier_partitions_its_sparse_layers(tmp_path, capsys):
    # A pruned network usually ends in a small Dense classifier: the command
    # partitions the SparseDense run before it (Dropout between is fine) and
    # names what it left out; a model without SparseDense layers is an error.
    model = keras.Sequential([keras.Input((12,)),
                              SparseDense(10, density=0.4, seed=0, name="s0"),
                              keras.layers.Dropout(0.1),
                              SparseDense(8, density=0.4, seed=1, name="s1"),
                              keras.layers.Dense(3, name="classifier")])
    path = tmp_path / "classifier.keras"
    model.save(path)
    code = main(["--model", str(path), "-k", "2", "--methods", "block",
                 "--plot", str(tmp_path / "c.png"), "--no-progress"])
    edges = model.layers[0].nnz + model.layers[2].nnz
    assert code == 0
    assert (f"model classifier.keras, SparseDense layers s0, s1 (left out: classifier): "
            f"{edges} edges") in capsys.readouterr().out
    dense = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="only")])
    dense.save(tmp_path / "dense.keras")
    assert main(["--model", str(tmp_path / "dense.keras"), "--no-progress",
                 "--plot", str(tmp_path / "d.png")]) == 2
    error = capsys.readouterr().err
    assert 'invalid value for "--model", expected a saved model with SparseDense' in error
    assert "layers with weights: Dense" in error


def test_bound_table_matches_volume_lower_bound(tmp_path, capsys):
    from tfsparse.partition import partition_rows
    from tfsparse.partition import volume_lower_bound

    model, path = save_sparse_model(tmp_path, (24, 24, 24), 0.3)
    code = main(["--model", str(path), "-k", "2", "--methods", "hypergraph",
                 "random", "--bound", "--plot", str(tmp_path / "b.png"),
                 "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0
    bound = int(volume_lower_bound(model, 2).sum())
    random_volume = partition_rows(model, 2, "random").volume
    hyper = partition_rows(model, 2, "hypergraph").volume
    assert "Any partition within epsilon sends at least:" in out
    assert (f"| 2 | {bound} | {bound / random_volume:.3f} | "
            f"{hyper / bound:.2f} | {random_volume / bound:.2f} |") in out


@pytest.mark.parametrize("option, message", [
    # Both failed only after every partition was computed (PIL's and Keras's
    # tracebacks).
    (["--plot", "/nonexistent/dir/p.png"], "--plot /nonexistent/dir/p.png: no directory"),
    (["--model", "/nonexistent.keras"], "--model /nonexistent.keras does not exist"),
])
def test_paths_are_checked_before_any_work(option, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--neurons", "32", "--layers", "2", "-k", "2", "--no-progress", *option])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
