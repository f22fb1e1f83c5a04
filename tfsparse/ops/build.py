"""Compile tfsparse's TensorFlow kernels: ``python -m tfsparse.ops.build``.

The kernels are built against the installed TensorFlow with the compile and
link flags from ``tf.sysconfig`` (the way Horovod and TensorFlow's custom-op
packages build their ops), into ``tfsparse/ops/kernels/_tfsparse_kernels.so``,
with a ``_tfsparse_kernels.json`` beside it that records the TensorFlow
version they were built against. ``make setup``, ``pip install`` and
``pip wheel`` run this.

One library serves every CPU of the architecture: nothing is compiled for the
build machine (no ``-march=native``). The compute code is compiled once per
instruction-set variant (portable, AVX2 + FMA, AVX-512) and the variant is
chosen at run time from what the CPU reports (``tfsparse.ops.kernels``).
Without the library tfsparse runs on its pure-TensorFlow fallback, which gives
the same results, more slowly.
"""

import argparse
import json
import os
import pathlib
import shlex
import subprocess
import sys

KERNEL_DIR = pathlib.Path(__file__).resolve().parent / "kernels"
LIBRARY_NAME = "_tfsparse_kernels.so"
LIBRARY_PATH = KERNEL_DIR / LIBRARY_NAME
# The compiler flags every build uses; only functions the variants mark get
# more than the architecture's baseline instructions.
FLAGS = [
    "-shared", "-fPIC", "-O3", "-fopenmp-simd", "-ffp-contract=fast",
    "-fvisibility=hidden", "-fvisibility-inlines-hidden",
    "-Wno-deprecated-declarations",
]


# Folders under the wheel's include/external that XLA's headers expect on
# the include path.
XLA_HEADER_DIRS = ("highwayhash", "farmhash_archive/src")


def build_info_path(library):
    """The JSON file that records what ``library`` was built against."""
    return pathlib.Path(library).with_suffix(".json")


def compile_command(output=LIBRARY_PATH, compiler="g++"):
    """Returns the compiler command line (a list) that builds the kernels.

    Example:
      >>> command = compile_command("/tmp/kernels.so")
      >>> "-march=native" in command, "-O3" in command
      (False, True)
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    sources = sorted(str(path) for path in KERNEL_DIR.glob("*.cc"))
    return (
        [compiler] + FLAGS
        + sources
        + ["-o", str(output)]
        + compile_flags()
        + tf.sysconfig.get_link_flags()
        # XLA's op registry and custom-call builder (sparse_conv_xla.cc).
        + ["-l:libtensorflow_cc.so.2"]
    )


def compile_flags():
    """The include paths and defines the sources compile with (any architecture).

    ``tf.sysconfig``'s, and two of the TensorFlow wheel's bundled libraries
    that XLA's headers (``sparse_conv_xla.cc``) include by their own paths.

    Example:
      >>> any(flag.endswith("highwayhash") for flag in compile_flags())
      True
    """
    import tensorflow as tf

    include = pathlib.Path(tf.sysconfig.get_include())
    return (tf.sysconfig.get_compile_flags()
            + [f"-I{include / 'external' / name}" for name in XLA_HEADER_DIRS])


def build(output=LIBRARY_PATH, compiler="g++", verbose=True):
    """Compiles the kernels and returns the path of the shared library.

    Also writes the build record (``build_info_path(output)``): the
    TensorFlow version and the compiler command.
    """
    import tensorflow as tf

    output = pathlib.Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    command = compile_command(output, compiler)
    if verbose:
        print("tfsparse: " + " ".join(shlex.quote(part) for part in command))
    subprocess.run(command, check=True)
    build_info_path(output).write_text(json.dumps({
        "tensorflow_version": tf.__version__,
        "compiler": compiler,
        "command": command,
    }, indent=1) + "\n")
    return output


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=str(LIBRARY_PATH))
    parser.add_argument("--compiler", default=os.environ.get("CXX", "g++"))
    args = parser.parse_args(argv)
    path = build(args.output, args.compiler)
    print(f"tfsparse: built {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
