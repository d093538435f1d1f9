#!/usr/bin/env bash
# The answers of two memplan binaries side by side: every command below (fit on the reference
# models, the zoo, Hugging Face configs and the ONNX fixtures; --max-batch, ZeRO stages,
# checkpointing, --serve, size errors, plan) is run with both, and its output and exit code
# compared. A change that should leave answers alone (a refactor) shows "same" on every line but
# the timing fields (plan_ms) and search statistics (plans_made).
#   bash bench/fit_answers.sh NEW_MEMPLAN OLD_MEMPLAN
set -uo pipefail
NEW=$1; OLD=$2
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
C=$ROOT/models/configs; O=$ROOT/tests/data/onnx
cmds=(
  "fit --model mlp --json"
  "fit --model cnn --json"
  "fit --model mlp --batch 4096 --hidden 1024,1024,512 --json"
  "fit --model cnn --batch 256 --image-size 56 --json"
  "fit --model gpt2 --json"
  "fit --model gpt2-medium --seq 512 --json"
  "fit --model llama-1b --json"
  "fit --model llama2-7b --dtype bf16 --device-memory 80GiB --json"
  "fit --model bert-base --json"
  "fit --model vit-b16 --json"
  "fit --model vit-b16 --image-size 384 --json"
  "fit --model resnet50 --json"
  "fit --model gpt2 --attention materialized --json"
  "fit --config $C/gpt2.json --json"
  "fit --config $C/llama-3.2-1b.json --seq 512 --json"
  "fit --config $C/vit-base-patch16-224.json --json"
  "fit --config $C/bert-base-uncased.json --json"
  "fit --config $C/mistral-7b-v0.1.json --dtype bf16 --seq 1024 --json"
  "fit --model mlp --max-batch --device-memory 64MiB --json"
  "fit --model cnn --max-batch --device-memory 256MiB --json"
  "fit --model gpt2 --seq 256 --max-batch --device-memory 16GiB --json"
  "fit --model resnet50 --max-batch --device-memory 8GiB --json"
  "fit --model gpt2 --devices 2 --zero 0 --json"
  "fit --model gpt2 --devices 2 --zero 1 --json"
  "fit --model gpt2 --devices 2 --zero 2 --json"
  "fit --model gpt2 --devices 2 --zero 3 --json"
  "fit --model mlp --devices 2 --zero 3 --batch 64 --json"
  "fit --model gpt2 --checkpoint sqrt --json"
  "fit --model llama-1b --checkpoint sqrt --device-memory 8GiB --json"
  "fit --model gpt2 --checkpoint optimal --device-memory 4GiB --json"
  "fit --model cnn --checkpoint sqrt --json"
  "fit --model gpt2 --device-memory 1GiB --minimum --json"
  "fit --model llama2-7b --batch 4000000000 --device-memory 80GiB"
  "fit --model llama-1b --seq 100000000000"
  "fit --model mlp --hidden 10000000000000000"
  "fit --model gpt2 --serve --json"
  "plan --model mlp --json"
  "plan --model cnn --json"
)
for f in "$O"/*.onnx; do cmds+=("fit --onnx $f --json" "fit --onnx $f --batch 64 --max-batch --device-memory 64MiB --json"); done
same=0; differ=0
for c in "${cmds[@]}"; do
  case "$c" in fit*--device-memory*|plan*) ;; fit*) c="$c --device-memory 80GiB";; esac
  a=$(timeout 300 "$NEW" $c 2>&1); ra=$?
  b=$(timeout 300 "$OLD" $c 2>&1); rb=$?
  if [ "$a" == "$b" ] && [ $ra == $rb ]; then same=$((same+1)); echo "same   (exit $ra) $c"
  else differ=$((differ+1)); echo "DIFFER (exit $ra vs $rb) $c"; diff <(echo "$a") <(echo "$b") | head -10; fi
done
echo "same $same, differ $differ"
