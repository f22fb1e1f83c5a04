"""Side-by-side timing: candidates run interleaved, medians compared."""

import importlib.util
import pathlib


def _load_package_timing():
    """tfsparse/_timing.py, loaded by path: it needs only NumPy, and the peers'
    PyTorch worker (benchmarks/peers.py) has no TensorFlow for tfsparse's
    ``__init__`` to import."""
    path = pathlib.Path(__file__).resolve().parents[1] / "tfsparse" / "_timing.py"
    spec = importlib.util.spec_from_file_location("tfsparse_timing", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


interleaved_medians = _load_package_timing().interleaved_medians


def cpu_model():
    """The CPU's model name as lscpu prints it (from /proc/cpuinfo), or the platform's."""
    import platform

    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def add_isa_argument(parser):
    """``--isa default|all|avx512|avx2|portable``: which kernel variants to time."""
    parser.add_argument(
        "--isa", default="default",
        help="kernel variant(s) to time: 'default' (the one tfsparse picks, or TFSPARSE_ISA), "
             "'all' (every variant this CPU supports, side by side), or one name")


def isas_to_run(choice):
    """The variants ``--isa choice`` asks for, checked against this CPU."""
    from tfsparse.ops import kernels

    if not kernels.available():
        return [None]
    if choice == "default":
        return [kernels.isa()]
    if choice == "all":
        return list(kernels.supported_isas())
    if choice not in kernels.supported_isas():
        raise SystemExit(f"--isa {choice}: this CPU supports {', '.join(kernels.supported_isas())}")
    return [choice]


def describe_machine(isas):
    """One line: the CPU, and the kernel variants timed."""
    from tfsparse.ops import kernels

    supported = ", ".join(kernels.supported_isas()) or "none (no compiled kernels)"
    timed = ", ".join(i for i in isas if i) or "the TensorFlow fallback"
    return f"CPU: {cpu_model()}; kernel variants supported: {supported}; timed: {timed}"


def check_layer_arguments(parser, args):
    """``parser.error`` unless --size, --repeats and every --batch are at least 1
    and --per-column is in [1, --size] (the benchmarks of one random layer)."""
    for option, value in (("--size", args.size), ("--repeats", args.repeats),
                          *(("--batch", b) for b in args.batch)):
        if value < 1:
            parser.error(f"{option} must be at least 1, received {value}")
    if not 1 <= args.per_column <= args.size:
        parser.error(f"--per-column must be in [1, --size={args.size}], received "
                     f"{args.per_column}")


def random_layer(size, per_column, rng):
    """The benchmarks' layer: ``(pattern, values)`` of a ``size x size`` kernel.

    A random ``SparsityPattern`` with ``per_column`` nonzeros per column
    (seed 0) and float32 values drawn from ``rng``, scaled by
    ``1 / sqrt(per_column)``; the caller's ``rng`` goes on to draw its inputs.
    """
    import numpy as np

    from tfsparse.ops import SparsityPattern

    pattern = SparsityPattern.random((size, size), per_column / size, seed=0)
    values = (rng.standard_normal(pattern.nnz) / np.sqrt(per_column)).astype(np.float32)
    return pattern, values
