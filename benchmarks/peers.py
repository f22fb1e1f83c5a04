"""SparseDense against the sparse layers a user would pick instead.

    make peers      # builds .venv-peers (PyTorch 2.13.0 CPU, SparseProp), then runs this
    python benchmarks/peers.py [--size 4096] [--per-column 32] [--batches 256 8]
        [--rounds 3] [--repeats 100] [--peers-python .venv-peers/bin/python]

The same layer (a random kernel, ``--per-column`` nonzeros per column,
float32) in every candidate: tfsparse's SparseDense on every kernel variant
the CPU supports, SparseProp's ``SparseLinear`` (PyTorch, CPU), a
``torch.sparse`` CSR product and SciPy's CSR product. SparseDense's
inference is timed in both forms a server calls: a ``tf.function`` (Python
dispatch on every call) and a SavedModel's serving signature (a concrete
function); each gets its own verdict. TensorFlow and PyTorch cannot share
one process (each brings its own thread pools and OpenMP), so
each framework's candidates run in a worker process of its own, interleaved
among themselves (medians), and the two workers take turns for ``--rounds``
rounds. Each worker also times SciPy's product: the reference that shows how
loaded the machine was in each process. Prints the range of the medians over
the rounds, and for every row how much faster SparseDense is than the fastest
peer (the worst round for SparseDense against the best for the peer).
Candidates missing from the peers' environment are reported as absent. The
peers' OpenMP threads wait passively (OMP_WAIT_POLICY=PASSIVE, their faster
setting on a few shared cores) unless the environment sets a policy.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np
import scipy.sparse

from timing import interleaved_medians

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT_PEERS_PYTHON = HERE.parent / ".venv-peers" / "bin" / "python"
SCIPY = "SciPy CSR (1 thread)"


def make_layer(size, per_column, seed=0):
    """The kernel ``W [size, size]`` (SciPy CSR) and its zero bias."""
    rng = np.random.default_rng(seed)
    rows = np.concatenate([rng.choice(size, per_column, replace=False) for _ in range(size)])
    cols = np.repeat(np.arange(size), per_column)
    values = (rng.standard_normal(rows.size) / np.sqrt(per_column)).astype(np.float32)
    return scipy.sparse.csr_matrix((values, (rows, cols)), shape=(size, size))


def batch_data(batch, size, seed=1):
    rng = np.random.default_rng(seed + batch)
    return (rng.standard_normal((batch, size)).astype(np.float32),
            rng.standard_normal((batch, size)).astype(np.float32))


def tfsparse_candidates(matrix, batch):
    """``{(row, name): callable}``: SparseDense on each variant, and SciPy."""
    import tensorflow as tf  # noqa: PLC0415 (only in the tfsparse worker)

    from sparse_dense_speed import serving_function  # noqa: PLC0415
    from sparse_dense_speed import signature_function  # noqa: PLC0415
    from sparse_dense_speed import sparse_dense_on  # noqa: PLC0415
    from sparse_dense_speed import train_step_fn  # noqa: PLC0415
    from tfsparse.ops import kernels  # noqa: PLC0415

    size = matrix.shape[0]
    x_numpy, target = batch_data(batch, size)
    x = tf.constant(x_numpy)
    candidates = {("inference", SCIPY): lambda: x_numpy @ matrix}
    for variant in kernels.supported_isas() or (None,):
        layer, used = sparse_dense_on(variant, size, matrix, x)
        name = f"tfsparse SparseDense [{used or 'TF fallback'}]"
        # Inference in both forms a server calls: a tf.function (Python
        # dispatch on every call) and a SavedModel's serving signature.
        for form, make in (("tf.function", serving_function), ("signature", signature_function)):
            predict = make(used, layer, x)
            candidates[("inference", f"{name} {form}")] = lambda f=predict: np.asarray(f())
        candidates[("training step", name)] = train_step_fn(layer, x, tf.constant(target), used)
    return candidates


def torch_candidates(matrix, batch):
    """``{(row, name): callable}``: SparseProp, torch.sparse CSR, SciPy."""
    import torch  # noqa: PLC0415 (only in the peers' worker)

    size = matrix.shape[0]
    x_numpy, target_numpy = batch_data(batch, size)
    x, target = torch.from_numpy(x_numpy), torch.from_numpy(target_numpy)
    kernel_t = torch.from_numpy(matrix.T.toarray())  # [units, input_dim], as nn.Linear
    candidates = {("inference", SCIPY): lambda: x_numpy @ matrix}
    csr_t = kernel_t.to_sparse_csr()

    def torch_sparse():
        with torch.no_grad():
            return torch.sparse.mm(csr_t, x.t()).t().numpy()

    candidates[("inference", "torch.sparse CSR")] = torch_sparse
    try:
        from sparseprop.modules import SparseLinear  # noqa: PLC0415
    except ImportError as error:
        print(f"SparseProp absent from the peers' environment ({error})", file=sys.stderr)
        return candidates
    layer = SparseLinear(kernel_t, bias=torch.nn.Parameter(torch.zeros(size)))
    optimizer = torch.optim.SGD(layer.parameters(), lr=1e-3)

    def predict():
        with torch.no_grad():
            return layer(x).numpy()

    # As sparse_dense_speed's step, the step of a layer inside a network: the
    # gradient with respect to the input too.
    x_watched = x.clone().requires_grad_(True)

    def train_step():
        optimizer.zero_grad()
        x_watched.grad = None
        loss = torch.mean(torch.square(layer(x_watched) - target))
        loss.backward()
        optimizer.step()
        return loss.item()

    candidates[("inference", "SparseProp SparseLinear")] = predict
    candidates[("training step", "SparseProp SparseLinear")] = train_step
    return candidates


def run_worker(args):
    """Times one framework's candidates for every batch; prints JSON."""
    matrix = scipy.sparse.load_npz(args.matrix).astype(np.float32)
    make = tfsparse_candidates if args.worker == "tfsparse" else torch_candidates
    results = []
    for batch in args.batches:
        candidates = make(matrix, batch)
        medians = interleaved_medians(candidates, repeats=args.repeats)
        results += [{"batch": batch, "row": row, "name": name, "seconds": seconds}
                    for (row, name), seconds in medians.items()]
    print(json.dumps(results))


def spawn(python, worker, matrix_path, args):
    command = [str(python), __file__, "--worker", worker, "--matrix", matrix_path,
               "--repeats", str(args.repeats), "--batches", *map(str, args.batches)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=os.pathsep.join(
        [str(HERE.parent), str(HERE), os.environ.get("PYTHONPATH", "")]))
    if worker == "torch":
        # PyTorch and SparseProp's backend each bring an OpenMP runtime whose
        # idle threads spin by default; on a few shared cores they steal them
        # from each other (here they made both peers 1.6-2x slower). Passive
        # waiting is the peers' best setting, unless the caller chose one.
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the {worker} worker failed:\n{done.stderr[-3000:]}")
    for line in done.stderr.splitlines():
        if "absent" in line:
            print(line)
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(samples, batches):
    """Medians' range over the rounds; SparseDense against the fastest peer."""
    for batch in batches:
        for row in ("inference", "training step"):
            times = {}
            for sample in samples:
                if sample["batch"] == batch and sample["row"] == row:
                    times.setdefault(sample["name"], []).append(sample["seconds"])
            if not times:
                continue
            print(f"\n{row}, batch {batch}: median ms, min-max over rounds")
            for name, values in sorted(times.items(), key=lambda item: min(item[1])):
                print(f"  {name:<40} {min(values) * 1e3:8.3f} - {max(values) * 1e3:8.3f}")
            peers = {n: v for n, v in times.items() if not n.startswith("tfsparse") and n != SCIPY}
            if not peers:
                continue
            fastest = min(peers, key=lambda n: min(peers[n]))
            for name in (n for n in times if n.startswith("tfsparse")):
                ratio = min(peers[fastest]) / max(times[name])
                verdict = "PASS" if ratio >= 1 else "FAIL"
                print(f"  {verdict}  {name} vs fastest peer ({fastest}): "
                      f"{ratio:.2f}x (worst round against its best)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--per-column", type=int, default=32)
    parser.add_argument("--batches", type=int, nargs="+", default=[256, 8])
    # At batch 8 here, SparseDense's medians of 30 calls spread by up to 31%
    # over two rounds; of 100 calls, by up to 7% over three.
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--peers-python", default=str(DEFAULT_PEERS_PYTHON))
    parser.add_argument("--worker", choices=("tfsparse", "torch"), help=argparse.SUPPRESS)
    parser.add_argument("--matrix", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return run_worker(args)
    if not pathlib.Path(args.peers_python).exists():
        raise SystemExit(f"Received an invalid value for \"--peers-python\", expected the "
                         f"Python of an environment with PyTorch (`make peers` builds one). "
                         f"Received: --peers-python={args.peers_python}")
    matrix = make_layer(args.size, args.per_column)
    print(f"kernel {args.size}x{args.size}, {args.per_column} nonzeros per column, float32; "
          f"{os.cpu_count()} CPUs; {args.rounds} rounds, each worker interleaving its "
          f"candidates ({args.repeats} runs, medians)")
    samples = []
    with tempfile.TemporaryDirectory() as folder:
        matrix_path = os.path.join(folder, "kernel.npz")
        scipy.sparse.save_npz(matrix_path, matrix)
        for round_index in range(args.rounds):
            for python, worker in ((sys.executable, "tfsparse"), (args.peers_python, "torch")):
                print(f"round {round_index + 1}/{args.rounds}: {worker} worker", flush=True)
                samples += spawn(python, worker, matrix_path, args)
    report(samples, args.batches)
    return None


if __name__ == "__main__":
    main()
