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

The level rates are those of streams, which the hardware prefetchers fetch
ahead. The kernels read their panels' and slices' rows at random (one per
nonzero), so ``gather_rate`` measures that access too: chunks of the row's
size at random offsets over a buffer of the panel's or slice's size. Given
it (``gathers=gather_seconds(variant, threads)``), the bounds charge those
rows at the measured gather rate instead: a looser bound, the one the
kernels' access pattern meets.
"""

import argparse
import ctypes
import functools
import hashlib
import os
import pathlib
import subprocess
import sys
import tempfile
import time

PROBES_SOURCE = pathlib.Path(__file__).resolve().parent / "roofline_probes.cc"
# Variant -> (floats per vector, g++ flags): the instruction sets variants.inc
# enables for tfsparse's kernels.
VARIANT_FLAGS = {
    "portable": (4, []),
    "avx2": (8, ["-mavx2", "-mfma"]),
    "avx512": (16, ["-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma"]),
}
LEVELS = ("L1", "L2", "L3", "memory")
SPMM_FEW_ROWS = 3  # kFewRows in tfsparse/ops/kernels/spmm_variant.inc: no panel up to it
# Threads on cores of their own reach about `threads` times one thread's
# multiply-adds and L1 and L2 loads (each core has its own); under
# SHARED_CORE_RATIO times, they shared a core while measured (SMT siblings,
# or a hypervisor running idle vCPUs on one core: the first of five runs of
# this script on the 2-core EPYC VM gave every rate at half, avx512 128
# Gmadd/s against 250-262; in one run of sparse_dense_speed.py only the L2
# rate came out low, a third of the usual), and the bounds would come out
# high. `measure` and `gather_rate` (over working sets that fit a core's L2)
# then measure again, up to SHARED_CORE_RETRIES times.
SHARED_CORE_RATIO = 1.5
SHARED_CORE_RETRIES = 3
PER_CORE = ("madds", "L1", "L2")


def _vector_bytes(variant):
    """Bytes in one of ``variant``'s float vectors."""
    return VARIANT_FLAGS[variant][0] * 4


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
    probes.roofline_gather_bytes_per_second.restype = ctypes.c_double
    probes.roofline_gather_bytes_per_second.argtypes = [ctypes.c_int, ctypes.c_int64,
                                                        ctypes.c_int64, ctypes.c_int64]
    return probes


def _best_of(probe, repeats=5):
    # The machine is shared: the fastest of a few runs is the closest to what
    # the hardware can do (the limit, not a typical time).
    return max(probe() for _ in range(repeats))


@functools.lru_cache(maxsize=None)
def measure(variant, threads):
    """Peak rates of ``variant`` on ``threads`` threads at once.

    Measured again (keeping each rate's best) while the threads reach under
    ``SHARED_CORE_RATIO`` times one thread's rate of a per-core resource
    (``PER_CORE``), and a warning on stderr if they still do.

    Returns:
      dict: ``"madds"`` multiply-adds per second; ``"L1"``, ``"L2"``,
      ``"L3"``, ``"memory"``: load bandwidth in bytes per second, each thread
      reading its own buffer of half its L1 / half its L2 / 8 MiB / 256 MiB.
    """
    probes = _compile(variant)
    if threads == 1:
        return _measure_once(probes, 1, LEVELS)
    single = _measure_once(probes, 1, [key for key in PER_CORE if key in LEVELS])
    return _checked_for_shared_cores(
        f"{threads} threads of {variant}", lambda: _measure_once(probes, threads, LEVELS),
        {key: single[key] for key in PER_CORE})


def _checked_for_shared_cores(who, measure_rates, single_rates):
    """``measure_rates()``, measured again while it looks as if its threads shared a core.

    That is while a rate named in ``single_rates`` (one thread's) is under
    ``SHARED_CORE_RATIO`` times it: up to ``SHARED_CORE_RETRIES`` times,
    keeping each rate's best, then a warning on stderr naming ``who`` and
    the rates still low.
    """
    rates = measure_rates()

    def shared():
        return [key for key, single in single_rates.items()
                if rates[key] < SHARED_CORE_RATIO * single]

    for _ in range(SHARED_CORE_RETRIES):
        if not shared():
            break
        time.sleep(1.0)
        again = measure_rates()
        rates = {key: max(rate, again[key]) for key, rate in rates.items()}
    for key in shared():
        print(f"roofline: {who} reached {rates[key] / single_rates[key]:.2f}x one thread's "
              f"{key} rate: they shared a core while measured, so that rate is low and the "
              "fractions of the bounds it sets high", file=sys.stderr)
    return rates


def _measure_once(probes, threads, levels):
    """``measure``'s rates of multiply-adds and loads from ``levels``, in one round.

    Each the best of a few runs. The buffers: half of L1, half of L2, 8 MiB,
    and 256 MiB or more for memory (twice L3 over the threads).
    """
    caches = cache_sizes()
    sizes = {"L1": caches["L1"] // 2, "L2": caches["L2"] // 2, "L3": 8 << 20,
             "memory": max(256 << 20, 2 * caches.get("L3", 0) // threads)}
    rates = {"madds": _best_of(lambda: probes.roofline_madds_per_second(threads, 2_000_000))}
    for level in levels:
        size = sizes[level]
        passes = max(1, (256 << 20) // size) if level != "memory" else 2
        rates[level] = _best_of(
            lambda size=size, passes=passes: probes.roofline_load_bytes_per_second(
                threads, size, passes), repeats=5 if level != "memory" else 2)
    return rates


def probe_chunk_bytes(variant, chunk_bytes):
    """The chunk the gather probe reads for rows of ``chunk_bytes`` bytes.

    Whole vectors of the variant (a row smaller than one, as the 8-float
    panel rows on AVX-512, is one vector: its cache line is read either
    way), in the counts the probe unrolls: 1, 2, 4 or a multiple of 8.
    """
    vector = _vector_bytes(variant)
    vectors = max(1, -(-chunk_bytes // vector))
    if vectors > 4:
        vectors = -(-vectors // 8) * 8
    elif vectors == 3:
        vectors = 4
    return vectors * vector


@functools.lru_cache(maxsize=None)
def gather_rate(variant, threads, working_set, chunk_bytes):
    """Bytes per second read as rows of ``chunk_bytes`` at random over ``working_set`` bytes.

    Each of ``threads`` threads reads a million chunks (``probe_chunk_bytes``)
    at random offsets of its own buffer of ``working_set`` bytes (at least
    one chunk), the offsets streamed as int32: a kernel's reads of a
    transposed panel's or slice's rows, one per nonzero. Best of 3 runs;
    over a working set that fits a core's L2, checked against one thread's
    rate as ``measure`` checks its rates.

    Example (builds the probes with g++; about a second):
      >>> rate = gather_rate("portable", 1, 1 << 18, 64)
      >>> rate > 0
      True
    """
    probes = _compile(variant)
    chunk = probe_chunk_bytes(variant, chunk_bytes)
    working_set = max(working_set, chunk) // chunk * chunk

    def rates_on(thread_count):
        return {"gather": _best_of(lambda: probes.roofline_gather_bytes_per_second(
            thread_count, working_set, chunk, 1 << 20), repeats=3)}

    if threads > 1 and working_set <= cache_sizes()["L2"]:
        rate = _checked_for_shared_cores(
            f"{threads} threads of {variant} reading {chunk}-byte rows over "
            f"{working_set >> 10} KiB", lambda: rates_on(threads), rates_on(1))["gather"]
    else:
        rate = rates_on(threads)["gather"]
    if rate <= 0:
        raise ValueError(f"gather probe: chunk of {chunk} bytes over {working_set} bytes "
                         f"is not a size it reads (variant {variant!r})")
    return rate


def gather_seconds(variant, threads):
    """``(working set, row bytes, rows) -> seconds``: reading ``rows`` rows at random.

    Each row's bytes at the rate ``gather_rate`` measures for its chunk
    (``probe_chunk_bytes``), a row smaller than a vector as a whole vector
    (its cache line is read either way): the ``gathers`` argument of the
    bounds.
    """
    vector = _vector_bytes(variant)

    def seconds(working_set, row_bytes, rows):
        rate = gather_rate(variant, threads, working_set, row_bytes)
        return rows * max(row_bytes, vector) / rate

    return seconds


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


def roofline(rates, madds, loads, gathered=None):
    """(bound seconds, binding resource) for ``madds`` and ``{level: bytes}``.

    ``gathered``: seconds of rows read at random at the gather probe's rate
    (the resource "random row reads"), or None.
    """
    times = {"multiply-adds": madds / rates["madds"]}
    if gathered is not None:
        times["random row reads"] = gathered
    for level, size in loads.items():
        times[f"{level} loads"] = times.get(f"{level} loads", 0) + size / rates[level]
    binding = max(times, key=times.get)
    return times[binding], binding


def spmm_panel_rows(variant, batch, n_in, caches, dtype_bytes=4):
    """The batch rows per panel the SpMM kernel uses (spmm_variant.inc).

    Batches of up to SPMM_FEW_ROWS rows read ``x`` itself (SpmmFewRows): one
    "panel" of exactly ``batch`` rows. 32-row panels only while one (``n_in * 32``
    floats) takes at most a quarter of the core's L2 (``caches["L2"]``, as
    ``cache_sizes`` gives it; cache_size.h).
    """
    if batch <= SPMM_FEW_ROWS:
        return batch
    l2 = caches.get("L2", 1 << 21)  # the kernels' kAssumedL2Bytes if unknown
    if dtype_bytes == 4 and batch >= 32 and variant != "portable" and n_in * 32 * 4 <= l2 // 4:
        return 32
    if dtype_bytes == 4 and batch >= 16:
        return 16
    return 8


def spmm_bound(rates, variant, batch, n_in, units, nnz, dtype_bytes=4, gathers=None):
    """The roofline of tfsparse's SpMM ``[batch, n_in] @ W[n_in, units]`` as blocked.

    Per panel of P batch rows (x transposed to ``[n_in][P]``): every nonzero
    costs P multiply-adds (rows past the batch included), one P-float load of
    a row of the panel at random (``_random_reads`` over its ``n_in * P``
    floats) and its value and index (8 bytes, streamed from the level that
    holds all of them); x and y cross memory once.

    ``gathers``: ``gather_seconds(variant, threads)``, or None. Given, the
    panel's rows are charged at the gather probe's rate, measured for the
    panel's size and row, instead of at the levels' stream rates.
    """
    caches = cache_sizes()
    panel_rows = spmm_panel_rows(variant, batch, n_in, caches, dtype_bytes)
    panels = -(-batch // panel_rows)
    panel_reads = nnz * panels * panel_rows * dtype_bytes
    loads, gathered = {}, None
    if gathers is None:
        loads = _random_reads(n_in * panel_rows * dtype_bytes, panel_reads, caches)
    else:
        if batch <= SPMM_FEW_ROWS:  # no panel: each nonzero reads an element of each row of x
            gathered = gathers(n_in * batch * dtype_bytes, dtype_bytes, nnz * batch)
        else:
            gathered = gathers(n_in * panel_rows * dtype_bytes, panel_rows * dtype_bytes,
                               nnz * panels)
    _add(loads, {_level(nnz * (dtype_bytes + 4), caches): nnz * panels * (dtype_bytes + 4)})
    _add(loads, {"memory": batch * (n_in + units) * dtype_bytes})
    return roofline(rates, nnz * panels * panel_rows, loads, gathered)


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


def sddmm_bound(rates, batch, n_in, units, nnz, dtype_bytes=4, gathers=None):
    """The roofline of the SDDMM ``out[k] = x[:, rows[k]] . dy[:, cols[k]]`` as blocked.

    As the layer runs it: on ``x [batch, n_in]`` and ``dy [batch, units]``,
    which the op reads from memory once and transposes, in slices of the
    batch (``sddmm_slice_rows``). Per slice of S rows, every nonzero is a
    dot product of two rows of S floats: the row of ``x`` at random
    (``_random_reads`` over the slice's ``n_in * S`` floats: the nonzeros of
    a column hit scattered rows), the row of ``dy`` from L1 (the nonzeros
    are sorted by column, so a column's nonzeros reuse it), and the indices
    and the output (read and written by every slice after the first) from
    the level that holds them. ``gathers``: as ``spmm_bound``'s, for the
    rows of ``x``.
    """
    caches = cache_sizes()
    slice_rows = sddmm_slice_rows(batch, n_in, dtype_bytes)
    slices = -(-batch // slice_rows)
    loads = {"memory": (n_in + units) * batch * dtype_bytes}
    gathered = None if gathers is None else 0.0
    for first in range(0, batch, slice_rows):
        rows = min(slice_rows, batch - first)
        if gathers is None:
            _add(loads, _random_reads(n_in * rows * dtype_bytes, nnz * rows * dtype_bytes,
                                      caches))
        else:
            gathered += gathers(n_in * rows * dtype_bytes, rows * dtype_bytes, nnz)
        _add(loads, {"L1": nnz * rows * dtype_bytes})
    per_nonzero = 8 + dtype_bytes  # its two indices, and its output read back
    _add(loads, {_level(nnz * per_nonzero, caches): nnz * (8 * slices + dtype_bytes * (slices - 1))})
    return roofline(rates, nnz * batch, loads, gathered)


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
    # The gather probe at the sizes of the 4096-input layer's panels (16
    # rows: 64-byte rows over 256 KiB) and SDDMM slices (128 rows: 512-byte
    # rows over 2 MiB).
    cases = {"64 B rows / 256 KiB": (1 << 18, 64), "512 B rows / 2 MiB": (1 << 21, 512)}
    print("\nrows read at random (gather probe), GB/s")
    print(f"{'variant':<10} " + " ".join(f"{case:>20}" for case in cases))
    for variant in variants:
        print(f"{variant:<10} " + " ".join(
            f"{gather_rate(variant, args.threads, size, row) / 1e9:>20.1f}"
            for size, row in cases.values()))


if __name__ == "__main__":
    main()
