"""The machine's limits for tfsparse's kernels, and each kernel's bound.

    python benchmarks/roofline.py [--threads 2]

Measures, on this CPU and for every kernel variant it supports (the probes in
roofline_probes.cc, compiled here once per variant with g++): peak
multiply-add throughput, and load bandwidth from L1, L2, L3 and memory for
buffers sized as the kernels' working sets. ``spmm_bound``/``sddmm_bound``
turn a kernel's own counts for its blocking (multiply-adds, bytes read at
each level) into the time below which it cannot run: the largest of the
times each resource needs on its own (a roofline). The speed benchmarks
print achieved fraction = bound / measured time.
"""

import argparse
import ctypes
import functools
import hashlib
import os
import pathlib
import subprocess
import tempfile

PROBES_SOURCE = pathlib.Path(__file__).resolve().parent / "roofline_probes.cc"
# Variant -> (floats per vector, g++ flags): the instruction sets variants.inc
# enables for tfsparse's kernels.
VARIANT_FLAGS = {
    "portable": (4, []),
    "avx2": (8, ["-mavx2", "-mfma"]),
    "avx512": (16, ["-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma"]),
}
LEVELS = ("L1", "L2", "L3", "memory")


def cache_sizes():
    """Per-core L1d and L2 and the shared L3 in bytes, from sysfs."""
    sizes = {}
    for index in pathlib.Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        level = int((index / "level").read_text())
        if (index / "type").read_text().strip() in ("Data", "Unified"):
            text = (index / "size").read_text().strip()
            scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1], 1)
            sizes[f"L{level}"] = int(text.rstrip("KM")) * scale
    return sizes


def _compile(variant):
    width, flags = VARIANT_FLAGS[variant]
    source = PROBES_SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join(flags).encode()).hexdigest()[:16]
    library = pathlib.Path(tempfile.gettempdir()) / f"tfsparse-roofline-{variant}-{key}.so"
    if not library.exists():
        partial = library.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run(
            ["g++", "-O3", "-std=c++17", "-shared", "-fPIC", "-pthread",
             f"-DVEC_FLOATS={width}", *flags, str(PROBES_SOURCE), "-o", str(partial)],
            check=True)
        partial.replace(library)
    probes = ctypes.CDLL(str(library))
    probes.roofline_madds_per_second.restype = ctypes.c_double
    probes.roofline_madds_per_second.argtypes = [ctypes.c_int, ctypes.c_int64]
    probes.roofline_load_bytes_per_second.restype = ctypes.c_double
    probes.roofline_load_bytes_per_second.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    return probes


def _best_of(probe, repeats=5):
    # The machine is shared: the fastest of a few runs is the closest to what
    # the hardware can do (the limit, not a typical time).
    return max(probe() for _ in range(repeats))


@functools.lru_cache(maxsize=None)
def measure(variant, threads):
    """Peak rates of ``variant`` on ``threads`` threads at once.

    Returns:
      dict: ``"madds"`` multiply-adds per second; ``"L1"``, ``"L2"``,
      ``"L3"``, ``"memory"``: load bandwidth in bytes per second, each thread
      reading its own buffer of half its L1 / half its L2 / 8 MiB / 256 MiB.
    """
    probes = _compile(variant)
    caches = cache_sizes()
    sizes = {"L1": caches["L1"] // 2, "L2": caches["L2"] // 2, "L3": 8 << 20,
             "memory": max(256 << 20, 2 * caches.get("L3", 0) // threads)}
    rates = {"madds": _best_of(lambda: probes.roofline_madds_per_second(threads, 2_000_000))}
    for level, size in sizes.items():
        passes = max(1, (256 << 20) // size) if level != "memory" else 2
        rates[level] = _best_of(
            lambda size=size, passes=passes: probes.roofline_load_bytes_per_second(
                threads, size, passes), repeats=5 if level != "memory" else 2)
    return rates


def _level(working_set, caches):
    """The first level whose per-core capacity holds ``working_set`` bytes."""
    for level in ("L1", "L2"):
        if working_set <= caches[level]:
            return level
    return "L3" if working_set <= caches.get("L3", 0) else "memory"


def _random_reads(working_set, nbytes, caches):
    """``{level: bytes}``: ``nbytes`` read at random over ``working_set`` bytes, at best.

    A cache of C bytes holds at most C / working_set of the set, so at most
    that share of reads spread over it can hit there (whatever its
    replacement policy): each level serves the share the levels above it
    cannot hold, the rest comes from memory. Optimistic, as a bound must be:
    a set a little larger than L2 is still mostly read from L2.
    """
    loads, held = {}, 0
    for level in ("L1", "L2", "L3"):
        holds = min(caches.get(level, 0), working_set)
        if holds > held:
            loads[level] = nbytes * (holds - held) / working_set
            held = holds
    if held < working_set:
        loads["memory"] = nbytes * (working_set - held) / working_set
    return loads


def _add(loads, more):
    """Adds ``more`` (``{level: bytes}``) into ``loads``; returns ``loads``."""
    for level, size in more.items():
        loads[level] = loads.get(level, 0) + size
    return loads


def roofline(rates, madds, loads):
    """(bound seconds, binding resource) for ``madds`` and ``{level: bytes}``."""
    times = {"multiply-adds": madds / rates["madds"]}
    for level, size in loads.items():
        times[f"{level} loads"] = times.get(f"{level} loads", 0) + size / rates[level]
    binding = max(times, key=times.get)
    return times[binding], binding


def spmm_panel_rows(variant, batch, n_in, caches, dtype_bytes=4):
    """The batch rows per panel the SpMM kernel uses (spmm_variant.inc).

    Batches of up to 3 rows read ``x`` itself (SpmmFewRows): one "panel" of
    exactly ``batch`` rows. 32-row panels only while one (``n_in * 32``
    floats) takes at most a quarter of the core's L2 (``caches["L2"]``, as
    ``cache_sizes`` gives it; cache_size.h).
    """
    if batch <= 3:
        return batch
    l2 = caches.get("L2", 1 << 21)  # the kernels' kAssumedL2Bytes if unknown
    if dtype_bytes == 4 and batch >= 32 and variant != "portable" and n_in * 32 * 4 <= l2 // 4:
        return 32
    if dtype_bytes == 4 and batch >= 16:
        return 16
    return 8


def spmm_bound(rates, variant, batch, n_in, units, nnz, dtype_bytes=4):
    """The roofline of tfsparse's SpMM ``[batch, n_in] @ W[n_in, units]`` as blocked.

    Per panel of P batch rows (x transposed to ``[n_in][P]``): every nonzero
    costs P multiply-adds (rows past the batch included), one P-float load of
    a row of the panel at random (``_random_reads`` over its ``n_in * P``
    floats) and its value and index (8 bytes, streamed from the level that
    holds all of them); x and y cross memory once.
    """
    caches = cache_sizes()
    panel_rows = spmm_panel_rows(variant, batch, n_in, caches, dtype_bytes)
    panels = -(-batch // panel_rows)
    loads = _random_reads(n_in * panel_rows * dtype_bytes,
                          nnz * panels * panel_rows * dtype_bytes, caches)
    _add(loads, {_level(nnz * (dtype_bytes + 4), caches): nnz * panels * (dtype_bytes + 4)})
    _add(loads, {"memory": batch * (n_in + units) * dtype_bytes})
    return roofline(rates, nnz * panels * panel_rows, loads)


SDDMM_SLICE_BYTES = 1 << 21  # kSliceBytes in tfsparse/ops/kernels/sddmm.cc


def sddmm_slice_rows(batch, n_in, dtype_bytes=4):
    """The batch rows per slice of the SDDMM on batch-major ``x`` (sddmm.cc's SliceRows)."""
    fits = SDDMM_SLICE_BYTES // max(1, n_in * dtype_bytes)
    if fits >= batch:
        return max(1, batch)
    rows = max(16, fits // 16 * 16)
    if rows >= batch:
        return batch
    slices = -(-batch // rows)
    return (-(-batch // slices) + 15) // 16 * 16


def sddmm_bound(rates, batch, n_in, units, nnz, dtype_bytes=4):
    """The roofline of the SDDMM ``out[k] = x[:, rows[k]] . dy[:, cols[k]]`` as blocked.

    As the layer runs it: on ``x [batch, n_in]`` and ``dy [batch, units]``,
    which the op reads from memory once and transposes, in slices of the
    batch (``sddmm_slice_rows``). Per slice of S rows, every nonzero is a
    dot product of two rows of S floats: the row of ``x`` at random
    (``_random_reads`` over the slice's ``n_in * S`` floats: the nonzeros of
    a column hit scattered rows), the row of ``dy`` from L1 (the nonzeros
    are sorted by column, so a column's nonzeros reuse it), and the indices
    and the output (read and written by every slice after the first) from
    the level that holds them.
    """
    caches = cache_sizes()
    slice_rows = sddmm_slice_rows(batch, n_in, dtype_bytes)
    slices = -(-batch // slice_rows)
    loads = {"memory": (n_in + units) * batch * dtype_bytes}
    for first in range(0, batch, slice_rows):
        rows = min(slice_rows, batch - first)
        _add(loads, _random_reads(n_in * rows * dtype_bytes, nnz * rows * dtype_bytes, caches))
        _add(loads, {"L1": nnz * rows * dtype_bytes})
    per_nonzero = 8 + dtype_bytes  # its two indices, and its output read back
    _add(loads, {_level(nnz * per_nonzero, caches): nnz * (8 * slices + dtype_bytes * (slices - 1))})
    return roofline(rates, nnz * batch, loads)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()
    from tfsparse.ops import kernels  # noqa: PLC0415 (TensorFlow only for the CPU's variants)

    variants = kernels.supported_isas() or ("portable",)
    caches = cache_sizes()
    print(f"cache per core: L1d {caches['L1'] >> 10} KiB, L2 {caches['L2'] >> 10} KiB; "
          f"L3 {caches.get('L3', 0) >> 20} MiB; best of repeated runs, {args.threads} threads\n")
    print(f"{'variant':<10} {'Gmadd/s':>9} " + " ".join(f"{lvl + ' GB/s':>12}" for lvl in LEVELS))
    for variant in variants:
        rates = measure(variant, args.threads)
        print(f"{variant:<10} {rates['madds'] / 1e9:>9.1f} "
              + " ".join(f"{rates[lvl] / 1e9:>12.1f}" for lvl in LEVELS))


if __name__ == "__main__":
    main()
