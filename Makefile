# tfsparse: `make demo` runs the main job, `make test` the test suite.
# Each creates .venv when it is missing; a second run reinstalls nothing.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.tfsparse-installed
KERNEL := tfsparse/ops/kernels/_tfsparse_kernels.so

.PHONY: setup test demo bench clean

setup: $(STAMP) $(KERNEL)

$(STAMP): setup.cfg pyproject.toml tools/build_horovod.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e ".[test]"
	PY=$(PY) bash tools/build_horovod.sh
	touch $@

$(KERNEL): $(wildcard tfsparse/ops/kernels/*.cc) tfsparse/ops/build.py $(STAMP)
	$(PY) -m tfsparse.ops.build

test: setup
	$(PY) -m pytest -q tests

demo: setup
	$(PY) examples/mnist_sparse.py

bench: setup
	$(PY) benchmarks/sparse_dense_speed.py

clean:
	rm -f $(KERNEL)
