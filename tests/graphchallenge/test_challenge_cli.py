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
from tfsparse.graphchallenge import parse_result_line
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
    assert f"categories: {len(expected)} of 100 inputs\ntfsparse == scipy: yes" in out
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


def test_inputs_beyond_the_file_are_an_error(challenge_dir, capsys):
    directory, _ = challenge_dir
    status = cli.main(["--data", str(directory), "--neurons", "64", "--layers", "3",
                       "--bias", "-0.3", "--no-progress", "--inputs", "61"])
    assert status == 2  # a usage error, as argparse's; 1 means categories disagree
    assert ('error: Received an invalid value for "--inputs", expected at most the 60 inputs of '
            f"{directory / 'sparse-images-64.tsv'}. Received: --inputs=61") in capsys.readouterr().err


def test_missing_challenge_files_are_a_usage_error(challenge_dir, tmp_path, capsys):
    directory, _ = challenge_dir
    for data, layers in ((directory, 4), (tmp_path / "absent", 3)):
        status = cli.main(["--data", str(data), "--neurons", "64", "--layers", str(layers),
                           "--bias", "-0.3", "--no-progress"])
        assert status == 2
        error = capsys.readouterr().err
        assert error.startswith("python -m tfsparse.graphchallenge: error: ")
        assert "No challenge weight file found" in error and "Traceback" not in error


def test_tiled_inputs_split_and_result_line(capsys):
    # 5,003 inputs: the sample's 5,000 digits, then digits 0-2 again (their categories repeat).
    status = cli.main(["--layers", "3", "--inputs", "5003", "--repeats", "1", "--no-progress",
                       "--no-reference"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert ("inputs: 5,003 (shipped MNIST sample, resized to 32x32 and binarised, its 5,000 "
            "digits repeated in order), bias -0.3") in out
    assert re.search(r"^time: load [0-9.]+ s, convert [0-9.]+ s \(tfsparse tensors and tracing\), "
                     r"infer [0-9.]+ s \(median of 1\)$", out, re.M)
    assert re.search(r"^peak memory: [0-9,]+ MiB \(process peak RSS, VmHWM", out, re.M)
    assert "truth: no categories file\n" in out and "scipy" not in out
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1 and lines[0] == out.rstrip().splitlines()[-1]
    result = parse_result_line(lines[0])
    assert list(result) == ["neurons", "layers", "edges", "inputs", "seconds", "edges_per_second",
                            "peak_rss_mib"]
    assert (result["neurons"], result["layers"], result["edges"], result["inputs"]) == (
        1024, 3, 3 * 32 * 1024, 5003)
    # Rate = inputs * edges / seconds: printed to 5 significant digits (5e-5 relative), from
    # seconds printed to 4 decimals (5e-5 absolute).
    rate = 5003 * 3 * 32 * 1024 / result["seconds"]
    np.testing.assert_allclose(result["edges_per_second"], rate,
                               rtol=5e-5 / result["seconds"] + 1e-4)
    distinct = categories(inference_scipy(mnist_features(1024), radixnet(1024, 3), -0.3))
    expected = len(distinct) + int(np.sum(distinct < 3))
    assert f"categories: {expected:,} of 5,003 inputs" in out


@pytest.mark.parametrize("argv, name, received", [
    (["--layers", "0"], "--layers", "0"),
    (["--neurons", "-1024"], "--neurons", "-1024"),
    (["--inputs", "0"], "--inputs", "0"),
    (["--batch-size", "0"], "--batch-size", "0"),
    (["--repeats", "-2"], "--repeats", "-2"),
    (["--threads", "0"], "--threads", "0"),
])
def test_bad_counts_name_the_argument(argv, name, received, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    assert (f'Received an invalid value for "{name}", expected a positive integer. '
            f"Received: {name}={received}") in capsys.readouterr().err


def test_size_without_a_challenge_bias(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--neurons", "64", "--layers", "2"])
    assert exit_info.value.code == 2
    assert ('Received an invalid value for "--neurons", expected one of the challenge\'s sizes '
            "1024, 4096, 16384, 65536, or --bias for another size. Received: --neurons=64"
            ) in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--bias", "nan"], 'for "--bias", expected a finite number. Received: --bias=nan'),
    (["--bias=-inf"], 'for "--bias", expected a finite number. Received: --bias=-inf'),
    (["--seed", "-1"], 'for "--seed", expected a non-negative integer. Received: --seed=-1'),
    (["--neurons", "63", "--bias", "0.1"],
     'for "--neurons", expected a perfect square for generated inputs'),
])
def test_bad_options_name_the_option(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--layers", "2", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_seed_with_data_is_an_error(challenge_dir, capsys):
    directory, _ = challenge_dir
    with pytest.raises(SystemExit):
        cli.main(["--data", str(directory), "--neurons", "64", "--layers", "3", "--bias", "-0.3",
                  "--seed", "1"])
    assert 'for "--seed", expected no --seed with --data' in capsys.readouterr().err


def test_truth_without_the_images_is_an_error(challenge_dir, capsys):
    # Before, generated inputs were checked against the official inputs'
    # categories: "tfsparse == truth: NO".
    directory, _ = challenge_dir
    (directory / "sparse-images-64.tsv").unlink()
    with pytest.raises(SystemExit):
        cli.main(["--data", str(directory), "--neurons", "64", "--layers", "3", "--bias", "-0.3"])
    assert ('for "--data", expected a directory holding sparse-images-64.tsv beside '
            "neuron64-l3-categories.tsv") in capsys.readouterr().err


def test_an_images_file_cut_short_fails_the_truth_check(challenge_dir, capsys):
    # The truth names inputs past the last one read: they were dropped, and
    # a file that had lost its tail reported "tfsparse == truth: yes".
    directory, truth = challenge_dir
    assert truth.max() >= 30
    write_features(directory / "sparse-images-64.tsv", mnist_features(64, num_inputs=60)[:30])
    status = cli.main(["--data", str(directory), "--neurons", "64", "--layers", "3",
                       "--bias", "-0.3", "--repeats", "1", "--no-progress", "--no-reference"])
    assert status == 1
    assert f"truth: {len(truth)} categories; tfsparse == truth: NO" in capsys.readouterr().out


def test_an_empty_images_file_is_a_usage_error(challenge_dir, capsys):
    directory, _ = challenge_dir
    (directory / "sparse-images-64.tsv").write_text("")
    status = cli.main(["--data", str(directory), "--neurons", "64", "--layers", "3",
                       "--bias", "-0.3", "--repeats", "1", "--no-progress"])
    assert status == 2  # was a ZeroDivisionError
    assert (f"error: The challenge file '{directory / 'sparse-images-64.tsv'}' holds no input"
            in capsys.readouterr().err)
