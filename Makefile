# tfsparse: `make demo` runs the main job, `make test` the test suite.
# Each creates .venv when it is missing; a second run reinstalls nothing.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.tfsparse-installed
KERNEL := tfsparse/ops/kernels/_tfsparse_kernels.so

.PHONY: setup test demo bench peers clean

setup: $(STAMP) $(KERNEL)

# The build requirements first, so the editable install compiles the kernels
# against the pinned TensorFlow already in the venv (no isolated build env).
$(STAMP): setup.cfg setup.py pyproject.toml constraints.txt tools/build_horovod.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c constraints.txt setuptools wheel tensorflow
	$(PY) -m pip install -q --no-build-isolation -c constraints.txt -e ".[test]"
	PY=$(PY) bash tools/build_horovod.sh
	touch $@

$(KERNEL): $(wildcard tfsparse/ops/kernels/*.cc tfsparse/ops/kernels/*.h tfsparse/ops/kernels/*.inc) tfsparse/ops/build.py $(STAMP)
	$(PY) -m tfsparse.ops.build

test: setup
	$(PY) -m pytest -q --durations=25 tests

# The main job on the shipped real data: a few minutes on 2 cores.
demo: setup
	$(PY) examples/mnist_sparse.py
	$(PY) -m tfsparse.graphchallenge --neurons 1024 --layers 120 --repeats 1
	$(PY) examples/fssl_mnist.py
	$(PY) examples/fssl_cnn.py
	$(PY) examples/rigl_mnist.py --epochs 5
	$(VENV)/bin/horovodrun -np 2 -H localhost:2 --gloo $(PY) examples/horovod_sidco_mnist.py --epochs 5
	$(PY) examples/pipeline_mnist.py --epochs 3
	$(VENV)/bin/horovodrun -np 2 -H localhost:2 --gloo $(PY) examples/partitioned_training.py

# SparseDense against the sparse layers of other frameworks: PyTorch (its
# CPU build) and SparseProp, in an environment of their own, outside $(VENV)
# and `make test`. SparseProp compiles its C++ backend at install: its setup
# calls pip and `python3 -m pybind11`, so the environment's bin comes first.
PEERS_VENV := .venv-peers
PEERS_STAMP := $(PEERS_VENV)/.peers-installed

$(PEERS_STAMP):
	test -x $(PEERS_VENV)/bin/python || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/pip install -q torch==2.13.0 numpy scipy pybind11 setuptools wheel
	PATH=$(CURDIR)/$(PEERS_VENV)/bin:$$PATH $(PEERS_VENV)/bin/pip install -q \
		--no-build-isolation sparseprop==0.1.14
	touch $@

peers: setup $(PEERS_STAMP)
	$(PY) benchmarks/peers.py --peers-python $(PEERS_VENV)/bin/python

# The README's figures (long: about 40 minutes on 2 cores).
bench: setup
	$(PY) benchmarks/sparse_dense_speed.py
	$(PY) benchmarks/sparse_dense_memory.py
	$(PY) benchmarks/sparse_conv_speed.py --isa all
	$(PY) benchmarks/sparse_conv_xla.py --isa all
	$(PY) benchmarks/sparse_resnet.py
	$(PY) -m tfsparse.graphchallenge --neurons 1024 --layers 120
	$(PY) benchmarks/fssl_crossover.py
	$(PY) benchmarks/fssl_mnist.py
	$(PY) benchmarks/fssl_graphchallenge.py
	$(PY) benchmarks/compression_speed.py
	$(PY) benchmarks/compression_quality.py
	$(PY) benchmarks/compression_convergence.py
	$(PY) benchmarks/pipeline_layerpipe_claim.py
	$(PY) benchmarks/partition_volume.py
	$(PY) benchmarks/partition_inference.py
	$(PY) benchmarks/pipeline_throughput.py

clean:
	rm -f $(KERNEL) $(KERNEL:.so=.json)
