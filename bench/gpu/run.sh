#!/bin/bash
# The GPU check, one call (< 8 minutes on an H200 with 16 cores): build memplan with CUDA, run
# the GPU tests (every op CUDA vs CPU, short trainings CPU vs GPU, planned/naive/dynamic bits),
# then benchmark against PyTorch eager on the same models and batches and write
# bench/results/gpu.json + bench/results/gpu.md. Nothing is downloaded.
# Usage: bench/gpu/run.sh [--quick]   (--quick leaves GPT-2 124M out)
set -euo pipefail
cd "$(dirname "$0")/../.."
QUICK=${1:-}
JOBS=$(nproc)
BUILD=build-gpu
start=$(date +%s)
stamp() { echo "== $(( $(date +%s) - start )) s: $*"; }

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
stamp "configure + build (-j$JOBS)"
LAUNCHER=()
command -v ccache >/dev/null && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DMEMPLAN_CUDA=ON -DMEMPLAN_BUILD_TESTS=ON -DMEMPLAN_BUILD_BENCH=ON -DMEMPLAN_NATIVE=ON \
  "${LAUNCHER[@]}" >/dev/null
cmake --build "$BUILD" -j"$JOBS" --target memplan memplan_tests bench_gpu_step

stamp "GPU tests"
"$BUILD"/tests/memplan_tests --gtest_filter='Cuda*:*CudaTraining*' --gtest_brief=1

stamp "memplan on the GPU"
mkdir -p bench/results
"$BUILD"/bench/bench_gpu_step --out bench/results/gpu_memplan.json $QUICK

stamp "PyTorch eager on the GPU"
PY=""
for candidate in python3 /usr/bin/python3; do
  if "$candidate" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    PY=$candidate
    break
  fi
done
rm -f bench/results/gpu_torch.json
if [ -n "$PY" ]; then
  $PY bench/gpu/torch_step.py --memplan bench/results/gpu_memplan.json --out bench/results/gpu_torch.json || \
    echo "torch_step.py failed; the table's PyTorch columns stay n/a"
else
  echo "PyTorch with CUDA is not available here; the table's PyTorch columns stay n/a"
fi

stamp "table"
python3 bench/gpu/render.py --memplan bench/results/gpu_memplan.json --torch bench/results/gpu_torch.json \
  --out-json bench/results/gpu.json --out-md bench/results/gpu.md
stamp "done"
