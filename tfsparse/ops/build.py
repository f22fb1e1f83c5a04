"""Compile tfsparse's optional TensorFlow kernels: ``python -m tfsparse.ops.build``.

The kernels are built against the installed TensorFlow with the compile and
link flags from ``tf.sysconfig`` (the way Horovod builds its ops), into
``tfsparse/ops/kernels/_tfsparse_kernels.so``. ``make setup`` runs this.
Without the library tfsparse runs on its pure-TensorFlow fallback, which gives
the same results, more slowly.
"""

import argparse
import os
import pathlib
import shlex
import subprocess
import sys

KERNEL_DIR = pathlib.Path(__file__).resolve().parent / "kernels"
LIBRARY_PATH = KERNEL_DIR / "_tfsparse_kernels.so"


def compile_command(output=LIBRARY_PATH, compiler="g++"):
    """Returns the compiler command line (a list) that builds the kernels."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    sources = sorted(str(path) for path in KERNEL_DIR.glob("*.cc"))
    return (
        [compiler, "-shared", "-fPIC", "-O3", "-march=native", "-fopenmp-simd",
         "-Wno-deprecated-declarations"]
        + sources
        + ["-o", str(output)]
        + tf.sysconfig.get_compile_flags()
        + tf.sysconfig.get_link_flags()
    )


def build(output=LIBRARY_PATH, compiler="g++", verbose=True):
    """Compiles the kernels and returns the path of the shared library."""
    command = compile_command(output, compiler)
    if verbose:
        print("tfsparse: " + " ".join(shlex.quote(part) for part in command))
    subprocess.run(command, check=True)
    return pathlib.Path(output)


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
