#!/usr/bin/env bash
# 8-bit AdamW (bitsandbytes' block-wise states) against AdamW on the reference GPT, the same steps,
# seed and learning rate: the validation loss each ends at (nats a character: the GPT's tokens are
# characters) and their difference, the optimizer state fit plans for each, the arena and the
# median step time, side by side. Rows at 300 steps and at train's default length.
#   bash bench/optimizer_8bit.sh [MEMPLAN] [OUT.json]
# MEMPLAN defaults to build/tools/memplan. QUICK=1 runs 30 steps (a smoke run).
# Needs Debian's fortunes (scripts/deps.sh installs it).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MEMPLAN=${1:-$ROOT/build/tools/memplan}
OUT=${2:-$ROOT/bench/results/optimizer_8bit.json}
if [[ "${QUICK:-0}" == 1 ]]; then
  lengths=("--steps 30")
else
  lengths=("--steps 300" "--steps 300 --lr 0.001" "")  # "": train's default length and learning rate
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
i=0
for length in "${lengths[@]}"; do
  for opt in adamw adamw8bit; do
    echo "bench: train --model gpt --optimizer $opt $length" >&2
    "$MEMPLAN" train --model gpt --optimizer $opt $length --seed 1 --quiet --json > "$tmp/$i-$opt.json"
    "$MEMPLAN" fit --model gpt --optimizer $opt --batch "$(python3 -c "import json; print(json.load(open('$tmp/$i-$opt.json'))['batch'])")" \
      --device cpu --device-memory 1GiB --json > "$tmp/$i-$opt-fit.json"
  done
  i=$((i + 1))
done
python3 - "$tmp" "$OUT" "$i" <<'PY'
import json, sys
tmp, out, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = []
print(f"{'optimizer':10} {'steps':>6} {'lr':>7} {'val loss':>9} {'- adamw':>8} {'state KiB':>10} {'x adamw':>8} "
      f"{'arena KiB':>10} {'step ms':>8} {'x adamw':>8}")
for i in range(runs):
    base = json.load(open(f"{tmp}/{i}-adamw.json"))
    base_fit = json.load(open(f"{tmp}/{i}-adamw-fit.json"))
    for opt in ("adamw", "adamw8bit"):
        r = json.load(open(f"{tmp}/{i}-{opt}.json"))
        f = json.load(open(f"{tmp}/{i}-{opt}-fit.json"))
        state = f["breakdown"]["optimizer_state"]
        row = {"optimizer": opt, "steps": r["steps"], "lr": r["lr"], "seed": r["seed"], "batch": r["batch"],
               "val_loss": r["val_loss"], "val_loss_minus_adamw": r["val_loss"] - base["val_loss"],
               "optimizer_state_bytes": state, "state_ratio": state / base_fit["breakdown"]["optimizer_state"],
               "arena_bytes": r["arena_bytes"], "fit_arena_bytes": f["arena_bytes"],
               "step_time_ms_median": r["step_time_ms_median"],
               "step_time_ratio": r["step_time_ms_median"] / base["step_time_ms_median"],
               "device_allocations_during_steps": r["device_allocations_during_steps"], "threads": r["threads"]}
        assert row["arena_bytes"] == row["fit_arena_bytes"], "fit plans the arena train allocates"
        assert row["device_allocations_during_steps"] == 0
        rows.append(row)
        print(f"{opt:10} {r['steps']:>6} {r['lr']:>7.4f} {r['val_loss']:>9.4f} {row['val_loss_minus_adamw']:>+8.4f} "
              f"{state / 1024:>10.1f} {row['state_ratio']:>8.3f} {r['arena_bytes'] / 1024:>10.1f} "
              f"{r['step_time_ms_median']:>8.3f} {row['step_time_ratio']:>8.2f}")
json.dump({"bench": "optimizer_8bit", "rows": rows}, open(out, "w"), indent=2)
print(f"wrote {out}")
PY
