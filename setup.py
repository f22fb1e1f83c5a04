"""Builds tfsparse's kernels into every install and wheel (metadata: setup.cfg).

`pip install .`, `pip wheel .` and `pip install -e .` compile
tfsparse/ops/kernels/*.cc against the TensorFlow of the build environment with
its own compile and link flags (tfsparse/ops/build.py), as TensorFlow's
custom-op packages do. The library is loaded with tf.load_op_library, so it is
no Python extension module: the wheel is marked as binary (a platform wheel)
and its version carries the TensorFlow it was built against (`+tf2.21.0`),
which must be the release setup.cfg pins.
"""

import configparser
import importlib.util
import pathlib
import re

import setuptools
from setuptools.command.build_py import build_py

ROOT = pathlib.Path(__file__).resolve().parent


def _pinned_tensorflow():
    """The TensorFlow release setup.cfg pins (the kernels' ABI)."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    requires = config["options"]["install_requires"]
    match = re.search(r"^\s*tensorflow==([\w.]+)\s*$", requires, re.M)
    if match is None:
        raise RuntimeError("setup.cfg must pin tensorflow==<version> (the kernels' ABI)")
    return match.group(1), config["metadata"]["version"]


def _kernel_builder():
    """tfsparse/ops/build.py, loaded by path (tfsparse itself is not importable yet)."""
    spec = importlib.util.spec_from_file_location("_tfsparse_build", ROOT / "tfsparse" / "ops" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithKernels(build_py):
    """build_py, then the kernel library beside the package's Python files."""

    def run(self):
        super().run()
        import tensorflow as tf

        pinned, _ = _pinned_tensorflow()
        if tf.__version__ != pinned:
            raise RuntimeError(
                f"tfsparse's kernels are built against TensorFlow {pinned} (setup.cfg pins it), "
                f"but the build environment has TensorFlow {tf.__version__}.")
        builder = _kernel_builder()
        if getattr(self, "editable_mode", False):
            target = builder.LIBRARY_PATH  # in the source tree, where the package is imported from
        else:
            target = pathlib.Path(self.build_lib) / "tfsparse" / "ops" / "kernels" / builder.LIBRARY_NAME
        builder.build(target, verbose=self.verbose > 1)


class BinaryDistribution(setuptools.Distribution):
    """A platform wheel: it carries a compiled library."""

    def has_ext_modules(self):
        return True


_TENSORFLOW, _VERSION = _pinned_tensorflow()
setuptools.setup(
    version=f"{_VERSION}+tf{_TENSORFLOW}",
    cmdclass={"build_py": BuildPyWithKernels},
    distclass=BinaryDistribution,
)
