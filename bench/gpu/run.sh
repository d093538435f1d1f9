#!/bin/bash
# The GPU check, one call (< 9 minutes on an H200 with 16 cores): build memplan with CUDA, run
# the GPU tests (every op CUDA vs CPU in fp32, bf16 and fp16, short trainings CPU vs GPU,
# planned/naive/dynamic bits), train on the GPU from the command line (mixed precision and GPT-2
# 124M in bf16 included), profile one step of each model per op, then
# benchmark against PyTorch eager on the same models and batches and write
# bench/results/gpu.json + bench/results/gpu.md, and record PyTorch memory snapshots for replay.
# Nothing is downloaded.
# Usage: bench/gpu/run.sh [--quick]   (--quick leaves GPT-2 124M out)
# Environment:
#   MEMPLAN_GPU_BUILD=DIR      build folder (default build-gpu)
#   MEMPLAN_GPU_PREBUILT=1     use the binaries already in DIR (built on a machine with the same
#                              toolkit; their shared libraries must be on LD_LIBRARY_PATH)
#   MEMPLAN_GPU_LIBS=DIRS      folders (colon-separated) of the shared libraries memplan's binaries
#                              need, put on LD_LIBRARY_PATH for them alone (not for PyTorch)
#   MEMPLAN_FMNIST_DIR=DIR     Fashion-MNIST for the command-line training stage (default: Debian's)
#   MEMPLAN_GPU_LOGS=DIR       also copy each stage's full output there
#   MEMPLAN_GPU_SNAPSHOTS=DIR  where PyTorch's memory snapshots recorded here go (default
#                              bench/results/gpu_snapshots): replay fixtures to commit
set -uo pipefail
cd "$(dirname "$0")/../.."
QUICK=${1:-}
JOBS=$(source scripts/deps.sh && memplan_jobs)  # in a subshell: deps.sh sets -e, this script goes on after failures
BUILD=${MEMPLAN_GPU_BUILD:-build-gpu}
LOGS=${MEMPLAN_GPU_LOGS:-}
FMNIST=${MEMPLAN_FMNIST_DIR:-/usr/share/datasets/fashion-mnist}
start=$(date +%s)
failures=()
stamp() { echo "== $(( $(date +%s) - start )) s: $*"; }
# stage NAME SECONDS COMMAND...: runs one stage under a time limit; a failure is reported at the
# end and the later stages still run (one call should show everything that is wrong).
stage() {
  local name=$1 limit=$2
  shift 2
  stamp "$name"
  local log=/dev/null
  [ -n "$LOGS" ] && log="$LOGS/${name// /_}.log"
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    echo "!! stage '$name' failed (exit $rc$([ "$rc" -eq 124 ] && echo ", over its ${limit} s"))"
    failures+=("$name")
  fi
  return 0
}
[ -n "$LOGS" ] && mkdir -p "$LOGS"

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
if [ "${MEMPLAN_GPU_PREBUILT:-0}" != 1 ]; then
  stamp "configure + build (-j$JOBS)"
  LAUNCHER=()
  command -v ccache >/dev/null && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DMEMPLAN_CUDA=ON -DMEMPLAN_BUILD_TESTS=ON -DMEMPLAN_BUILD_BENCH=ON \
    -DMEMPLAN_NATIVE=ON "${LAUNCHER[@]}" >/dev/null || exit 1
  cmake --build "$BUILD" -j"$JOBS" --target memplan memplan_tests bench_gpu_step bench_replay_snapshots || exit 1
fi
MEMPLAN="$BUILD/tools/memplan"
MP=(env "LD_LIBRARY_PATH=${MEMPLAN_GPU_LIBS:+$MEMPLAN_GPU_LIBS:}${LD_LIBRARY_PATH:-}")

stage "GPU tests" 200 "${MP[@]}" "$BUILD"/tests/memplan_tests \
  --gtest_filter='Cuda*:*CudaTraining*:*CudaMixedTraining*:KernelDispatch.*:DecodeStep.Cuda*:NcclCommunicator.*:StepProfile.*'

stage "train on the GPU" 150 "${MP[@]}" bash -c "
  set -e
  if [ -d '$FMNIST' ]; then
    '$MEMPLAN' train --model mlp --device cuda --data '$FMNIST' --epochs 1 --json
    '$MEMPLAN' train --model cnn --device cuda --data '$FMNIST' --epochs 1 --json
  else
    echo 'no Fashion-MNIST at $FMNIST: the MLP and CNN command-line runs are left out'
  fi
  '$MEMPLAN' train --model gpt --device cuda --data docs --steps 300 --profile --json"

# Mixed precision on the GPU: the GPT in bf16 and fp16 (loss scaling), an fp32 run with TF32, and
# GPT-2 124M (its 50257-token vocabulary over the text's bytes) in bf16, whose arena must be the
# one fit plans for it, with 0 allocations during steps.
stage "mixed precision on the GPU" 240 "${MP[@]}" bash -c "
  set -e
  for d in bf16 fp16; do '$MEMPLAN' train --model gpt --device cuda --data docs --steps 300 --dtype \$d --json; done
  '$MEMPLAN' train --model gpt --device cuda --data docs --steps 300 --tf32 --json
  if [ -z '$QUICK' ]; then
    g2='--config models/configs/gpt2.json --vocab 50257 --batch 8 --seq 1024 --dtype bf16'
    '$MEMPLAN' fit \$g2 --device cuda --device-memory 80GiB --json
    '$MEMPLAN' train \$g2 --device cuda --data docs --steps 20 --json
  fi"

stage "profile on the GPU" 150 "${MP[@]}" bash -c "
  set -e
  '$MEMPLAN' plan --model cnn --batch 64 --device cuda --profile
  '$MEMPLAN' plan --model gpt --batch 32 --device cuda --profile
  if [ -z '$QUICK' ]; then '$MEMPLAN' plan --model gpt2 --batch 8 --seq 1024 --device cuda --profile; fi"

mkdir -p bench/results
stage "memplan bench" 200 "${MP[@]}" "$BUILD"/bench/bench_gpu_step --out bench/results/gpu_memplan.json $QUICK

PY=""
for candidate in python3 /usr/bin/python3; do
  if "$candidate" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    PY=$candidate
    break
  fi
done
rm -f bench/results/gpu_torch.json
if [ -z "$PY" ]; then
  echo "PyTorch with CUDA is not available here; the table's PyTorch columns stay n/a"
elif [ -f bench/results/gpu_memplan.json ]; then
  stage "PyTorch eager on the GPU" 200 "$PY" bench/gpu/torch_step.py --memplan bench/results/gpu_memplan.json \
    --out bench/results/gpu_torch.json
fi

# Real PyTorch memory snapshots of varied runs on this GPU (bench/gpu/record_snapshots.py: a GPT
# step with and without expandable segments, a ResNet, two streams, a run recorded mid-training,
# an out-of-memory), then memplan's replay of each, whole and cut at ten points.
if [ -n "$PY" ]; then
  SNAPS=${MEMPLAN_GPU_SNAPSHOTS:-bench/results/gpu_snapshots}
  stage "record PyTorch snapshots" 150 "$PY" bench/gpu/record_snapshots.py --out "$SNAPS"
  stage "replay the snapshots" 120 "${MP[@]}" "$BUILD"/bench/bench_replay_snapshots --dir "$SNAPS" --cuts 10 \
    --json-out "$SNAPS/replay.json"
fi

if [ -f bench/results/gpu_memplan.json ]; then
  stage "table" 30 python3 bench/gpu/render.py --memplan bench/results/gpu_memplan.json \
    --torch bench/results/gpu_torch.json --out-json bench/results/gpu.json --out-md bench/results/gpu.md
fi
if ((${#failures[@]})); then
  stamp "done; failed stages: ${failures[*]}"
  exit 1
fi
stamp "done"
