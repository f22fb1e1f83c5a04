"""The Sparse DNN Graph Challenge at scale: tfsparse against the SciPy reference.

For each network size (generated RadiX-Net, ``tfsparse.graphchallenge.radixnet``,
seed 0, 32 connections per neuron, weights 1/16, the challenge's bias) and each
input count, one process (so its peak memory is its own):

1. generates the network and converts it to tfsparse's tensors (timed: load,
   convert);
2. runs tfsparse's inference (``tfsparse.graphchallenge.inference``: surviving
   rows only, merged across batches) on the inputs, timed once per
   ``--repeats`` (median), and reads the process's peak RSS (``VmHWM``, ``peak_rss_bytes``)
   right after, before the reference allocates anything;
3. runs the serial SciPy CSR reference (``inference_scipy``) on the first
   ``k`` inputs, ``k = min(5000, --reference-budget / edges)``, timed once, and
   reports its rate per input-edge (``k * edges / seconds``). With ``k`` below
   the input count this rate is an extrapolation from those ``k`` inputs, and
   the table says so (``ref. inputs``);
4. checks tfsparse's categories against the reference's exactly: on all
   inputs when the reference covered the 5,000 distinct digits (the inputs
   beyond 5,000 repeat them in order, and rows are independent under the
   challenge's rule, so the reference's categories of 60,000 inputs are those
   of the 5,000 digits, repeated), else on the first ``k`` inputs only (the
   table says which).

Rate = inputs * edges / seconds, edges = 32 * neurons * layers (the challenge's
definition). Results go to out/graphchallenge_scale.json and a markdown table.

Usage:
    python benchmarks/graphchallenge_scale.py                       # the default cases, ~11 min
    python benchmarks/graphchallenge_scale.py --sizes 16384x480 --inputs 60000
    python benchmarks/graphchallenge_scale.py --max-work 4e12       # skip the largest runs
    python benchmarks/graphchallenge_scale.py --sizes 1024x120,4096x480 --inputs 5000
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from timing import cpu_model  # noqa: E402  (benchmarks/timing.py)

DEFAULT_SIZES = ("1024x120,1024x480,1024x1920,4096x120,4096x480,4096x1920,"
                 "16384x120,16384x480,16384x1920")
# Every default case on every input count (11 min on 2 quiet cores); 16384 x 1920
# (1G edges, ~22 GiB of weights) is skipped by --memory-gib on machines of 24 GiB.
DEFAULT_MAX_WORK = float("inf")
DISTINCT_INPUTS = 5000  # the MNIST digits shipped with tfsparse
# Memory of a network: SciPy CSR (4-byte values and column indices) plus
# tfsparse's tensors (values, rows, cols, row-major order: 4 bytes each).
BYTES_PER_EDGE = 8 + 16


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=DEFAULT_SIZES,
                        help=f"comma-separated NEURONSxLAYERS cases (default {DEFAULT_SIZES})")
    parser.add_argument("--inputs", default="5000,60000",
                        help="comma-separated input counts (default 5000,60000)")
    parser.add_argument("--repeats", type=int, default=1, help="timed tfsparse runs (median)")
    parser.add_argument("--reference-budget", type=float, default=2e11,
                        help="SciPy reference work per case in input-edges; its inputs are "
                             "min(5000, budget / edges) (default 2e11)")
    parser.add_argument("--max-work", type=float, default=DEFAULT_MAX_WORK,
                        help="skip (size, inputs) cases with more input-edges than this "
                             "(default: no limit)")
    parser.add_argument("--memory-gib", type=float, default=16.0,
                        help="skip networks whose weights need more than this (default 16)")
    parser.add_argument("--case-timeout", type=float, default=2400.0,
                        help="seconds allowed per network size (default 2400)")
    parser.add_argument("--out", default="out/graphchallenge_scale.json")
    parser.add_argument("--case", default=None, help=argparse.SUPPRESS)  # internal: one child
    return parser.parse_args(argv)


def parse_sizes(text):
    sizes = []
    for item in text.split(","):
        neurons, _, layers = item.strip().partition("x")
        if not (neurons.isdigit() and layers.isdigit()):
            raise SystemExit(f'Received an invalid value for "--sizes", expected '
                             f"NEURONSxLAYERS items such as 1024x120. Received: {item!r}")
        sizes.append((int(neurons), int(layers)))
    return sizes


def parse_counts(text):
    counts = [item.strip() for item in text.split(",")]
    if not all(count.isdigit() and int(count) > 0 for count in counts):
        raise SystemExit(f'Received an invalid value for "--inputs", expected comma-separated '
                         f"positive integers. Received: {text!r}")
    return [int(count) for count in counts]


def run_case(neurons, layers, counts, args):
    """The child: one network size, every input count; prints one JSON line per count."""
    import numpy as np

    from tfsparse import graphchallenge as gc
    from tfsparse.ops import kernels

    start = time.perf_counter()
    weights = gc.radixnet(neurons, layers)
    load_seconds = time.perf_counter() - start
    bias, edges = gc.default_bias(neurons), gc.count_edges(weights)
    start = time.perf_counter()
    network = gc.prepare_network(weights)
    gc.inference(gc.mnist_features(neurons, num_inputs=1), network, bias, progress=False)
    convert_seconds = time.perf_counter() - start
    reference_inputs = int(min(DISTINCT_INPUTS, max(1, args.reference_budget // edges)))
    reference = None
    for inputs in counts:
        features = gc.mnist_features(neurons, num_inputs=inputs)
        seconds = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            ours = gc.inference(features, network, bias)
            seconds.append(time.perf_counter() - start)
        peak = gc.peak_rss_bytes()
        checked = min(inputs, reference_inputs)
        if reference is None or reference[0] < checked:
            start = time.perf_counter()
            activations = gc.inference_scipy(features[:checked], weights, bias, progress=True)
            reference = (checked, time.perf_counter() - start, gc.categories(activations))
        ours_categories = gc.categories(ours)
        expected = _expected_categories(reference, inputs)
        if expected is None:  # the reference saw only the first `checked` inputs
            theirs = reference[2]
            agree = np.array_equal(ours_categories[ours_categories < checked],
                                   theirs[theirs < checked])
            scope = f"first {checked:,}"
        else:
            agree, scope = np.array_equal(ours_categories, expected), "all"
        infer = statistics.median(seconds)
        print(json.dumps({
            "neurons": neurons, "layers": layers, "edges": edges, "inputs": inputs,
            "load_s": load_seconds, "convert_s": convert_seconds, "infer_s": infer,
            "edges_per_s": inputs * edges / infer, "peak_rss_mib": peak / 2**20,
            "reference_inputs": reference[0], "reference_s": reference[1],
            "reference_edges_per_s": reference[0] * edges / reference[1],
            "categories": int(ours_categories.size), "agree": bool(agree), "checked": scope,
            "result_line": gc.result_line(neurons, layers, edges, inputs, infer, peak),
            "isa": kernels.isa() if kernels.available() else "TF fallback",
            "load_average_1min": os.getloadavg()[0],  # the machine is shared: other load
        }), flush=True)


def _expected_categories(reference, inputs):
    """The reference's categories of ``inputs`` tiled inputs, or None if it saw too few."""
    import numpy as np

    checked, _, found = reference
    if checked >= inputs:
        return found[found < inputs]
    if checked < DISTINCT_INPUTS:
        return None
    # Input i is digit i mod 5000 and rows are independent: the categories repeat.
    copies = -(-inputs // DISTINCT_INPUTS)
    tiled = (found[None, :] + DISTINCT_INPUTS * np.arange(copies)[:, None]).ravel()
    return tiled[tiled < inputs]


def run_all(args):
    sizes, counts = parse_sizes(args.sizes), parse_counts(args.inputs)
    rows, skipped = [], []
    limit = args.memory_gib * 2**30
    for index, (neurons, layers) in enumerate(sizes, start=1):
        need = 32 * neurons * layers * BYTES_PER_EDGE
        if need > limit:
            skipped.append(f"{neurons}x{layers}: the weights need ~{need / 2**30:.0f} GiB "
                           f"(--memory-gib {args.memory_gib:g})")
            print(f"[{index}/{len(sizes)}] skipped {skipped[-1]}", flush=True)
            continue
        edges = 32 * neurons * layers
        runs = [count for count in counts if count * edges <= args.max_work]
        skipped.extend(f"{neurons}x{layers} on {count:,} inputs: {count * edges:.3g} input-edges, "
                       f"over --max-work {args.max_work:.3g}" for count in counts if count not in runs)
        if not runs:
            continue
        print(f"[{index}/{len(sizes)}] {neurons} neurons x {layers} layers, inputs {runs}",
              flush=True)
        command = [sys.executable, __file__, "--case", f"{neurons}x{layers}",
                   "--inputs", ",".join(map(str, runs)), "--repeats", str(args.repeats),
                   "--reference-budget", str(args.reference_budget)]
        try:
            done = subprocess.run(command, stdout=subprocess.PIPE, text=True,
                                  timeout=args.case_timeout)
        except subprocess.TimeoutExpired:
            skipped.append(f"{neurons}x{layers}: over --case-timeout {args.case_timeout:g} s")
            continue
        if done.returncode != 0:
            skipped.append(f"{neurons}x{layers}: the case failed (exit {done.returncode})")
            continue
        for line in done.stdout.splitlines():
            if line.startswith("{"):
                rows.append(json.loads(line))
                print(rows[-1]["result_line"], flush=True)
        save(args, rows, skipped)  # after every case: a run cut short keeps what it measured
    return rows, skipped


def save(args, rows, skipped):
    path = pathlib.Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"args": vars(args), "cpu": cpu_model(), "rows": rows,
                                "skipped": skipped}, indent=1))
    return path


def table(rows):
    lines = ["| neurons x layers | edges | inputs | tfsparse s | tfsparse edges/s | peak RSS MiB "
             "| SciPy edges/s (inputs timed) | tfsparse / SciPy | categories = SciPy's |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(
            f"| {row['neurons']} x {row['layers']} | {row['edges'] / 1e6:.1f}M | {row['inputs']:,} "
            f"| {row['infer_s']:.2f} | {row['edges_per_s']:.3g} | {row['peak_rss_mib']:,.0f} "
            f"| {row['reference_edges_per_s']:.3g} ({row['reference_inputs']:,}) "
            f"| {row['edges_per_s'] / row['reference_edges_per_s']:.1f}x "
            f"| {'yes' if row['agree'] else 'NO'} ({row['checked']}; {row['categories']:,}) |")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    if args.case is not None:
        (neurons, layers), = parse_sizes(args.case)
        run_case(neurons, layers, parse_counts(args.inputs), args)
        return 0
    start = time.perf_counter()
    rows, skipped = run_all(args)
    isa = sorted({row["isa"] for row in rows})
    loads = [row["load_average_1min"] for row in rows]
    print(f"\nCPU: {cpu_model()}; kernel variant: {', '.join(isa)}; "
          f"{time.perf_counter() - start:.0f} s in all; 1-minute load average "
          f"{min(loads, default=0):.1f}-{max(loads, default=0):.1f} on {os.cpu_count()} CPUs")
    print(f"command: python benchmarks/graphchallenge_scale.py {' '.join(sys.argv[1:])}".rstrip())
    print(table(rows))
    for line in skipped:
        print(f"skipped {line}")
    print(f"wrote {save(args, rows, skipped)}")
    return 0 if all(row["agree"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
