"""The package as users install it: sdist -> wheel -> a fresh venv.

From the repository's tracked files (a clean checkout), build the sdist, build
the wheel from the sdist (so everything the kernels need must travel in it),
install the wheel into a new venv outside the repository and run
wheel_check.py there. Dependencies come from pip's cache (constraints.txt
pins them), so this takes a few minutes, not a download of TensorFlow.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import zipfile

import numpy as np
import pytest
import tensorflow as tf

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The variables that would let the venv see the repository.
CLEAN_ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}


def _run(*command, cwd=None, timeout=900):
    return subprocess.run([str(c) for c in command], cwd=cwd, env=CLEAN_ENV, capture_output=True,
                          text=True, timeout=timeout, check=True)


def _clean_checkout(target):
    """The files git tracks or would track, as in the working tree (no build outputs, no venv)."""
    listed = _run("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=ROOT).stdout.split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the git checkout to know the tracked files")
    work = tmp_path_factory.mktemp("wheel")
    source = _clean_checkout(work / "src")
    dist = work / "dist"
    _run(sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", dist, source)
    (sdist,) = dist.glob("tfsparse-*.tar.gz")
    _run(sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", dist, sdist)
    (wheel,) = dist.glob("tfsparse-*.whl")
    return work, sdist, wheel


def test_sdist_carries_the_kernel_sources_and_no_binary(built):
    _, sdist, _ = built
    with tarfile.open(sdist) as archive:
        names = [pathlib.PurePosixPath(n).name for n in archive.getnames()]
    kernel_sources = {p.name for p in (ROOT / "tfsparse/ops/kernels").iterdir() if p.suffix in (".cc", ".h", ".inc")}
    assert kernel_sources <= set(names)
    assert not any(n.endswith(".so") for n in names)
    assert "LICENSE" in names
    # setuptools' default took tests/test*.py alone: a suite that cannot run.
    assert not any(part == "tests" for n in archive_paths(sdist) for part in n.parts[1:2])


def archive_paths(sdist):
    with tarfile.open(sdist) as archive:
        return [pathlib.PurePosixPath(n) for n in archive.getnames()]


def test_wheel_is_tagged_for_its_tensorflow_and_carries_the_library(built):
    _, _, wheel = built
    assert f"+tf{tf.__version__}-" in wheel.name
    assert "-none-any" not in wheel.name  # a platform wheel
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        record = json.loads(archive.read("tfsparse/ops/kernels/_tfsparse_kernels.json"))
    assert "tfsparse/ops/kernels/_tfsparse_kernels.so" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE")
               for n in names)
    metadata = archive_metadata(wheel)
    # One TensorFlow distribution: tf-keras requires tensorflow, and
    # tensorflow-cpu beside it installed the same files over each other.
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert f"Requires-Dist: tensorflow=={tf.__version__}" in requires
    assert not any("tensorflow-cpu" in line for line in requires)
    assert record["tensorflow_version"] == tf.__version__
    assert "-march=native" not in record["command"]


def test_installed_wheel_trains_and_serves_in_a_fresh_venv(built):
    work, _, wheel = built
    venv = work / "venv"
    _run(getattr(sys, "_base_executable", sys.executable), "-m", "venv", venv)
    python = venv / "bin" / "python"
    # --no-compile: byte-compiling TensorFlow would take most of the time.
    _run(python, "-m", "pip", "install", "-q", "--no-compile", "-c", ROOT / "constraints.txt", wheel, timeout=1200)
    out = work / "out"
    out.mkdir()
    run = _run(python, ROOT / "tests/packaging/wheel_check.py", out, cwd=work)
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert pathlib.Path(report["tfsparse_file"]).is_relative_to(venv)
    assert report["isa"] is not None and report["isa"] == report["supported"][0]
    assert all(report["weights_changed"])
    # The SavedModel computes with TensorFlow's CSR ops, Keras with the
    # compiled kernels: the same sums in another order. Each output sums at
    # most 30 products, a ReLU, then 16 more: float32 rounding of at most
    # (30 + 16 + 2) * eps relative to the sums of magnitudes, which the
    # inputs and initialisers keep within a few times the largest output.
    bound = 4 * 48 * np.finfo(np.float32).eps * max(1.0, report["largest_output"])
    assert report["served_max_difference"] <= bound


def archive_metadata(wheel):
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return archive.read(name).decode()
