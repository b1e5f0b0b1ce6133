#!/usr/bin/env bash
# Everything issue 10 checks on a lent GPU machine, in one go (one device call):
# install carried wheels, print the machine, run tests/gpu, run the benchmark.
# Usage (on the GPU machine, repository root, wheels in .whl): bash tools/gpu_run.sh [OUT]
set -uo pipefail
out=${1:-${OUT:-/tmp/gpu_out}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
export TORCH_EXTENSIONS_DIR=/tmp/torch_extensions
# DeepSpeed cannot parse arch names such as "9.0a" when it JIT-builds its fused Adam.
export TORCH_CUDA_ARCH_LIST="${DS_ARCH_LIST:-9.0}"
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv | tee "$out/machine.txt"
python3 -c "import torch,sys;print(sys.version, torch.__version__, torch.version.cuda)" | tee -a "$out/machine.txt"
python3 -c "import deepspeed;print('deepspeed', deepspeed.__version__)" 2>&1 | tail -1 | tee -a "$out/machine.txt"
timeout 240 python3 -m pytest tests/gpu -q -p no:cacheprovider -o addopts="" --timeout 200 \
  2>&1 | tee "$out/pytest_gpu.log"
echo "pytest rc=${PIPESTATUS[0]}"
timeout "${BENCH_TIMEOUT:-330}" python3 tools/gpu_bench.py --out "$out/gpu_bench.json" \
  --sections "${SECTIONS:-mover,ipc,ds2,zero3}" --deadline-s "${BENCH_DEADLINE:-240}" \
  2>&1 | tee "$out/bench.log" | grep -v "^\[20" | tail -60
