"""Tests of ``python -m tfsparse.graphchallenge``."""

import re
import subprocess
import sys

import numpy as np
import pytest

from tfsparse.graphchallenge import __main__ as cli
from tfsparse.graphchallenge import categories
from tfsparse.graphchallenge import inference_scipy
from tfsparse.graphchallenge import mnist_features
from tfsparse.graphchallenge import radixnet
from tfsparse.graphchallenge import write_categories
from tfsparse.graphchallenge import write_features
from tfsparse.graphchallenge import write_network

RATE = re.compile(r"^(tfsparse|scipy   ): [0-9.]+ s, ([0-9.e+]+) edges/s \(median of 1\)$", re.M)


def test_command_runs_generated_network():
    command = [sys.executable, "-m", "tfsparse.graphchallenge", "--neurons", "1024", "--layers", "4",
               "--inputs", "100", "--repeats", "1", "--no-progress"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "network: 1024 neurons x 4 layers, 131,072 edges, generated RadiX-Net (seed 0)" in out
    assert "inputs: 100 (shipped MNIST sample, resized to 32x32 and binarised), bias -0.3" in out
    # The categories the command reports are those of the SciPy reference.
    expected = categories(inference_scipy(mnist_features(1024, num_inputs=100), radixnet(1024, 4), -0.3))
    assert f"categories: {len(expected)} of 100 inputs; tfsparse == scipy: yes" in out
    assert len(RATE.findall(out)) == 2 and float(RATE.findall(out)[0][1]) > 0
    assert re.search(r"^ratio tfsparse / scipy: [0-9.]+x$", out, re.M)


@pytest.fixture
def challenge_dir(tmp_path):
    """A small network in the official layout, with images and the truth computed by SciPy."""
    weights = radixnet(64, 3, seed=4, connections=8, weight=0.25)
    features = mnist_features(64, num_inputs=60)
    write_network(tmp_path, weights)
    write_features(tmp_path / "sparse-images-64.tsv", features)
    truth = categories(inference_scipy(features, weights, -0.3))
    assert 0 < len(truth) < 60
    write_categories(tmp_path / "neuron64-l3-categories.tsv", truth)
    return tmp_path, truth


def test_data_directory_checks_truth(challenge_dir, capsys):
    directory, truth = challenge_dir
    status = cli.main(["--data", str(directory), "--neurons", "64", "--layers", "3", "--bias", "-0.3",
                       "--repeats", "1", "--no-progress", "--batch-size", "7"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert f"inputs: 60 ({directory / 'sparse-images-64.tsv'}), bias -0.3" in out
    assert f"truth: {len(truth)} categories; tfsparse == truth: yes" in out


def test_wrong_truth_fails(challenge_dir, capsys):
    directory, truth = challenge_dir
    write_categories(directory / "neuron64-l3-categories.tsv", truth[1:])
    status = cli.main(["--data", str(directory), "--neurons", "64", "--layers", "3", "--bias", "-0.3",
                       "--repeats", "1", "--no-progress"])
    assert status == 1
    assert "tfsparse == truth: NO" in capsys.readouterr().out


def test_inputs_limit_filters_truth(challenge_dir, capsys):
    directory, truth = challenge_dir
    status = cli.main(["--data", str(directory), "--neurons", "64", "--layers", "3", "--bias", "-0.3",
                       "--repeats", "1", "--no-progress", "--inputs", "30"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert f"truth: {np.sum(truth < 30)} categories; tfsparse == truth: yes" in out


@pytest.mark.parametrize("argv, message", [
    (["--neurons", "64", "--layers", "2"], "expected one of the challenge's sizes"),
    (["--layers", "0"], "--layers must be a positive integer, got 0"),
])
def test_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
