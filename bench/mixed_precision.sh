#!/usr/bin/env bash
# Mixed precision on the CPU, per reference model and dtype (fp32, bf16, fp16), the same steps and
# seed: the arena train allocates, the median step time, and what the run learned (the MLP's test
# accuracy, the GPT's validation loss), with ratios to fp32 side by side. The CPU stores 16 bits
# and computes in fp32, so 16-bit steps add conversions: the table says how much they cost here.
#   bash bench/mixed_precision.sh [MEMPLAN] [OUT.json]
# MEMPLAN defaults to build/tools/memplan. QUICK=1 runs a few steps per model (a smoke run).
# Needs Debian's dataset-fashion-mnist and fortunes (scripts/deps.sh installs them).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MEMPLAN=${1:-$ROOT/build/tools/memplan}
OUT=${2:-$ROOT/bench/results/mixed_precision.json}
if [[ "${QUICK:-0}" == 1 ]]; then
  runs=("mlp --steps 20" "cnn --steps 5" "gpt --steps 20")
else
  # The MLP and the GPT train their default lengths (5 epochs; 3000 steps); the CNN 300 steps.
  runs=("mlp" "cnn --steps 300" "gpt")
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for run in "${runs[@]}"; do
  model=${run%% *}
  for dtype in fp32 bf16 fp16; do
    echo "bench: train --model $run --dtype $dtype" >&2
    "$MEMPLAN" train --model $run --dtype $dtype --seed 1 --quiet --json > "$tmp/$model-$dtype.json"
  done
done
python3 - "$tmp" "$OUT" "${runs[@]}" <<'PY'
import json, sys
tmp, out, runs = sys.argv[1], sys.argv[2], sys.argv[3:]
rows = []
print(f"{'model':6} {'dtype':5} {'steps':>6} {'arena MiB':>10} {'x fp32':>7} {'step ms':>8} {'x fp32':>7} "
      f"{'final loss':>10} {'quality':>22} {'skipped':>7}")
for run in runs:
    model = run.split()[0]
    base = json.load(open(f"{tmp}/{model}-fp32.json"))
    for dtype in ("fp32", "bf16", "fp16"):
        r = json.load(open(f"{tmp}/{model}-{dtype}.json"))
        if "test_accuracy" in r:
            quality = f"acc {100 * r['test_accuracy']:.2f}% ({100 * (r['test_accuracy'] - base['test_accuracy']):+.2f})"
        else:
            quality = f"val {r['val_loss']:.4f} ({r['val_loss'] - base['val_loss']:+.4f})"
        row = {"model": model, "dtype": dtype, "steps": r["steps"], "arena_bytes": r["arena_bytes"],
               "arena_ratio": r["arena_bytes"] / base["arena_bytes"], "step_time_ms_median": r["step_time_ms_median"],
               "step_time_ratio": r["step_time_ms_median"] / base["step_time_ms_median"], "final_loss": r["final_loss"],
               "test_accuracy": r.get("test_accuracy"), "val_loss": r.get("val_loss"),
               "skipped_steps": r.get("skipped_steps", 0), "loss_scale": r.get("loss_scale"),
               "device_allocations_during_steps": r["device_allocations_during_steps"], "threads": r["threads"]}
        rows.append(row)
        print(f"{model:6} {dtype:5} {r['steps']:>6} {r['arena_bytes'] / 2**20:>10.2f} {row['arena_ratio']:>7.3f} "
              f"{r['step_time_ms_median']:>8.3f} {row['step_time_ratio']:>7.2f} {r['final_loss']:>10.4f} {quality:>22} "
              f"{row['skipped_steps']:>7}")
json.dump({"bench": "mixed_precision", "rows": rows}, open(out, "w"), indent=2)
print(f"wrote {out}")
PY
