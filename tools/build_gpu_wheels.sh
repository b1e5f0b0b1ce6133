#!/usr/bin/env bash
# Build the small wheels a GPU machine without a package registry needs to run rltrain's GPU
# tests and benchmarks: DeepSpeed (pure Python, ops JIT-compiled there), its pure-Python and
# binary dependencies, omegaconf/hydra-core/antlr4 (rltrain.config), and rltrain itself.
# PyTorch is NOT included: the GPU machine brings its own CUDA build.
#
# Usage: tools/build_gpu_wheels.sh [OUT_DIR=.whl] [PYTHON_VERSION=3.12]
# Then carry OUT_DIR and, on the GPU machine:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site OUT_DIR/*.whl
#   export PYTHONPATH=/tmp/site
set -euo pipefail
out=${1:-.whl}
py=${2:-3.12}
mkdir -p "$out"
dl() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$out" "$@"
}
# DeepSpeed ships as an sdist: build a pure-Python wheel with no ops pre-compiled.
DS_BUILD_OPS=0 python3 -m pip wheel -q --no-deps --no-build-isolation deepspeed==0.19.8 -w "$out"
dl hjson==3.1.0 pydantic==2.13.4 pydantic_core==2.46.4 annotated-types==0.7.0 \
   typing-inspection==0.4.2 omegaconf==2.3.1 hydra-core==1.3.8
python3 -m pip wheel -q --no-deps antlr4-python3-runtime==4.9.3 -w "$out"
# rltrain itself (optional: a checkout on PYTHONPATH works as well).
if [[ "${WITH_RLTRAIN:-0}" == 1 ]]; then
  python3 -m pip wheel -q --no-deps --no-build-isolation . -w "$out"
fi
ls -la "$out"
du -sh "$out"
