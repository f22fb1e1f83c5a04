"""Convergence and modelled step time: SIDCo at 0.01 against uncompressed training.

    python benchmarks/compression_convergence.py [--epochs 20] [--seeds 0 1 2] [--workers 2]

Runs ``examples/horovod_sidco_mnist.py`` under ``horovodrun -np <workers>
-H localhost:<workers> --gloo`` for each seed, once with ``--compressor none``
(dense allreduce) and once with SIDCo at ratio 0.01, the same epochs, data
split and initial weights, and prints test accuracy, bytes per step and the
step time modelled at 1, 10 and 25 Gbit/s.

The workers talk over loopback on one 2-core machine, so the measured
wall-clock communication time says nothing about a network. The model:
step time = compute + bytes on the wire / bandwidth, where compute is the
measured median step time minus the measured exchange (collective) time,
so it includes SIDCo's compression; the wire bytes per worker are those of a
ring allreduce of the dense gradient, ``2 (N-1)/N * dense``, and of a ring
allgather of the sparse payloads, ``(N-1) * payload``; latency terms are left
out. Rows for N = 16 reuse the measured compute and payload per worker.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "horovod_sidco_mnist.py"
BANDWIDTHS_GBIT = (1, 10, 25)


def run(compressor, seed, epochs, workers, out):
    path = out / f"{compressor}_seed{seed}.json"
    horovodrun = pathlib.Path(sys.executable).with_name("horovodrun")
    command = [str(horovodrun), "-np", str(workers), "-H", f"localhost:{workers}", "--gloo",
               sys.executable, str(EXAMPLE), "--compressor", compressor, "--ratio", "0.01",
               "--epochs", str(epochs), "--seed", str(seed), "--json", str(path)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    with open(path) as handle:
        return json.load(handle)


def wire_bytes(result, workers):
    if result["compressor"].startswith("NoCompression"):
        return 2 * (workers - 1) / workers * result["dense_bytes_per_step"]
    return (workers - 1) * result["bytes_sent_per_step"]


def modelled_ms(result, workers, gbit):
    compute = result["step_time_s"] - result["exchange_time_s"]
    return 1e3 * (compute + wire_bytes(result, workers) * 8 / (gbit * 1e9))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default="out/compression_convergence")
    args = parser.parse_args(argv)
    out = ROOT / args.out
    out.mkdir(parents=True, exist_ok=True)

    results = {"none": [], "sidco": []}
    for seed in args.seeds:
        for compressor in results:
            print(f"seed {seed}: {compressor} ...", file=sys.stderr, flush=True)
            results[compressor].append(run(compressor, seed, args.epochs, args.workers, out))

    print(f"MNIST MLP (784-256-128-10, shipped 4,000/1,000-digit sample), {args.workers} Horovod "
          f"workers (Gloo, loopback), {args.epochs} epochs, Adam 1e-3, batch 32 per worker; "
          f"seeds {args.seeds}\n")
    print("| training | test accuracy per seed | mean | bytes sent / step / worker | "
          "compute ms / step | measured step ms (loopback) |")
    print("|---|---|---|---|---|---|")
    means = {}
    for name, runs in results.items():
        accuracies = [r["test_accuracy"] for r in runs]
        means[name] = sum(accuracies) / len(accuracies)
        first = runs[0]
        sent = sum(r["bytes_sent_per_step"] for r in runs) / len(runs)
        compute = sum(r["step_time_s"] - r["exchange_time_s"] for r in runs) / len(runs)
        step = sum(r["step_time_s"] for r in runs) / len(runs)
        label = "uncompressed (allreduce)" if name == "none" else "SIDCo 0.01 (allgather)"
        print(f"| {label} | {', '.join(f'{100 * a:.1f}' for a in accuracies)} | "
              f"{100 * means[name]:.2f} | {sent:,.0f} (dense {first['dense_bytes_per_step']:,.0f}) | "
              f"{1e3 * compute:.1f} | {1e3 * step:.1f} |")

    print("\nModelled step time, ms (compute + wire bytes / bandwidth; mean over seeds)\n")
    print("| workers | training | " + " | ".join(f"{g} Gbit/s" for g in BANDWIDTHS_GBIT) + " |")
    print("|---|---|" + "---|" * len(BANDWIDTHS_GBIT))
    for workers in sorted({args.workers, 16}):
        for name, runs in results.items():
            label = "uncompressed" if name == "none" else "SIDCo 0.01"
            cells = [sum(modelled_ms(r, workers, g) for r in runs) / len(runs) for g in BANDWIDTHS_GBIT]
            print(f"| {workers} | {label} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")

    gap = 100 * (means["none"] - means["sidco"])
    verdict = "met" if gap <= 1.0 else "NOT met"
    print(f"\nTarget: SIDCo within 1 point of uncompressed accuracy: gap {gap:+.2f} points ({verdict})")


if __name__ == "__main__":
    main()
