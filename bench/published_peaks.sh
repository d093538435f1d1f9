#!/usr/bin/env bash
# memplan's fit beside published measured peaks of LoRA and QLoRA fine-tuning (litgpt's resource
# tables, torchtune's recipe tables), each recipe as its source ran it: the model, micro-batch,
# sequence length, precision, LoRA rank and targets, quantization and activation checkpointing.
# Columns: the published peak (PyTorch's torch.cuda.max_memory_allocated, which leaves out the
# CUDA context), memplan's arena for the same step (what it allocates), fit's total (the arena plus
# the runtime overhead fit adds for the context and libraries), and compare's model of PyTorch
# eager's allocated peak for the step; the published peak minus the arena is what a static plan
# saves plus what the source's eager code holds that the model does not.
#   bash bench/published_peaks.sh [MEMPLAN] [OUT.json]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MEMPLAN=${1:-$ROOT/build/tools/memplan}
OUT=${2:-$ROOT/bench/results/published_peaks.json}
# source|recipe|published bytes|memplan flags
LITGPT="--dtype bf16 --lora 8:16 --lora-targets q,v --lora-dtype working --lora-dropout 0.05 --seq 1304 --device-memory 40GB"
TT2="--dtype bf16 --lora 8:16 --lora-targets q,v --lora-dtype working --seq 1304 --checkpoint sqrt --device-memory 24GiB"
TT3="--dtype bf16 --lora 8:16 --lora-targets q,v,o,gate,up,down --lora-dtype working --seq 2048 --checkpoint sqrt --device-memory 24GiB"
rows=(
  "litgpt|Llama-2-7B LoRA, micro-batch 1|21300000000|--model llama2-7b --batch 1 $LITGPT"
  "litgpt|Llama-2-7B QLoRA nf4, micro-batch 1|14140000000|--model llama2-7b --batch 1 --quant nf4 $LITGPT"
  "litgpt|Llama-2-7B QLoRA nf4-dq, micro-batch 1|13840000000|--model llama2-7b --batch 1 --quant nf4 --double-quant $LITGPT"
  "litgpt|Llama-2-7B LoRA, micro-batch 2|29070000000|--model llama2-7b --batch 2 $LITGPT"
  "litgpt|Llama-2-13B LoRA, micro-batch 1|38120000000|--model llama2-13b --batch 1 $LITGPT"
  "litgpt|Llama-2-13B QLoRA nf4, micro-batch 1|23140000000|--model llama2-13b --batch 1 --quant nf4 $LITGPT"
  "litgpt|Llama-2-13B QLoRA nf4-dq, micro-batch 1|22550000000|--model llama2-13b --batch 1 --quant nf4 --double-quant $LITGPT"
  "torchtune|Llama-2-7B LoRA, batch 2|15570000000|--model llama2-7b --batch 2 $TT2"
  "torchtune|Llama-2-7B QLoRA, batch 2|9290000000|--model llama2-7b --batch 2 --quant nf4 --double-quant $TT2"
  "torchtune|Llama-3.1-8B LoRA, batch 2, 2048 tokens|17394617549|--model llama3.1-8b --batch 2 $TT3"
  "torchtune|Llama-3.1-8B QLoRA, batch 2, 2048 tokens|7945689497|--model llama3.1-8b --batch 2 --quant nf4 --double-quant $TT3"
)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
i=0
for row in "${rows[@]}"; do
  IFS='|' read -r source recipe published flags <<< "$row"
  echo "bench: fit $flags" >&2
  "$MEMPLAN" fit $flags --json > "$tmp/$i-fit.json"
  # compare takes the same step (its --device-memory is the simulated card's) but plans no
  # activation checkpointing: rows that checkpoint have no eager column.
  if [[ "$flags" != *--checkpoint* ]]; then
    "$MEMPLAN" compare ${flags/--device-memory/--device cuda --device-memory} --json > "$tmp/$i-compare.json"
  else
    echo '{}' > "$tmp/$i-compare.json"
  fi
  printf '%s\n%s\n%s\n%s\n' "$source" "$recipe" "$published" "$flags" > "$tmp/$i-row.txt"
  i=$((i + 1))
done
python3 - "$tmp" "$OUT" "$i" <<'PY'
import json, sys
tmp, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = []
print(f"| source | recipe | published peak | memplan arena | fit total | PyTorch eager as compare models it | published - arena |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
for i in range(n):
    source, recipe, published, flags = open(f"{tmp}/{i}-row.txt").read().splitlines()
    fit = json.load(open(f"{tmp}/{i}-fit.json"))
    cmp = json.load(open(f"{tmp}/{i}-compare.json"))
    published = int(published)
    eager = cmp["caching_pytorch_step"]["allocated_peak_bytes"] if cmp else None
    row = {"source": source, "recipe": recipe, "flags": flags, "published_peak_bytes": published,
           "arena_bytes": fit["arena_bytes"], "fit_total_bytes": fit["total_bytes"],
           "runtime_overhead_bytes": fit["breakdown"]["runtime_overhead"],
           "activations_bytes": fit["breakdown"]["activations"], "parameters_bytes": fit["breakdown"]["parameters"],
           "pytorch_eager_model_allocated_peak_bytes": eager, "published_minus_arena_bytes": published - fit["arena_bytes"],
           "published_minus_eager_model_bytes": published - eager if eager else None}
    rows.append(row)
    gb = lambda b: f"{b / 1e9:.2f} GB" if b is not None else "-"
    print(f"| {source} | {recipe} | {gb(published)} | {gb(row['arena_bytes'])} | {gb(row['fit_total_bytes'])} | "
          f"{gb(eager)} | {gb(row['published_minus_arena_bytes'])} |")
json.dump({"bench": "published_peaks", "rows": rows}, open(out, "w"), indent=2)
print(f"wrote {out}")
PY
