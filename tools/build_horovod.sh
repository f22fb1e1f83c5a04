#!/usr/bin/env bash
# Build Horovod 0.28.1 (TensorFlow + Gloo, no MPI) against the TensorFlow in the
# current virtual environment, once, and cache the wheel outside the repository.
#
# Horovod 0.28.1 is an sdist only, and its xla_mpi_ops.cc includes XLA headers
# that TensorFlow >= 2.19 no longer ships. That file only serves XLA on GPUs, so
# it is dropped from the build (see ../shared/platform.md).
set -euo pipefail
PY=${PY:-.venv/bin/python}
HOROVOD_VERSION=0.28.1
TF_VERSION=$($PY -c 'import importlib.metadata as m; print(m.version("tensorflow-cpu") if any(d.metadata["Name"]=="tensorflow-cpu" for d in m.distributions()) else m.version("tensorflow"))')
CACHE=${TFSPARSE_CACHE:-$HOME/.cache/tfsparse}/wheels/tf-$TF_VERSION
mkdir -p "$CACHE"
wheel=$(ls "$CACHE"/horovod-$HOROVOD_VERSION-*.whl 2>/dev/null | head -n1 || true)
if [ -z "$wheel" ]; then
  echo "tfsparse: building Horovod $HOROVOD_VERSION against TensorFlow $TF_VERSION (about 5 minutes, once)"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  $PY -m pip download -q --no-deps --no-binary :all: -d "$work" "horovod==$HOROVOD_VERSION"
  tar -xzf "$work"/horovod-$HOROVOD_VERSION.tar.gz -C "$work"
  src="$work/horovod-$HOROVOD_VERSION"
  sed -i '/xla_mpi_ops.cc/d' "$src/horovod/tensorflow/CMakeLists.txt"
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
  HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j"$(nproc)" \
    $PY -m pip wheel -q --no-build-isolation --no-deps -w "$CACHE" "$src"
  wheel=$(ls "$CACHE"/horovod-$HOROVOD_VERSION-*.whl | head -n1)
fi
$PY -m pip install -q "$wheel"
echo "tfsparse: Horovod installed from $wheel"
