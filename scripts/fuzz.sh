#!/usr/bin/env bash
# Fuzzes every parser of untrusted input and the solvers with libFuzzer (clang, ASan + UBSan).
#   scripts/fuzz.sh [SECONDS_PER_TARGET (default 60)] [TARGET...]
# Builds build-fuzz/, starts each target from its committed seeds (fuzz/corpus/<target>/, copied
# so the committed corpus stays small), runs it for the given time and prints a table of
# executions and findings. Findings (crash-*, leak-*, timeout-*, oom-* inputs) are left in
# build-fuzz/findings/<target>/; fix each one and commit it as fuzz/corpus/<target>/regress-NAME
# so tests/fuzz_corpus_test.cpp replays it in every test run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/deps.sh
memplan_install_deps "${MEMPLAN_FUZZ_PACKAGES[@]}"

seconds="${1:-60}"
shift || true
targets=("$@")
if ((${#targets[@]} == 0)); then
  targets=(byte_size minimalloc_csv idx safetensors cli solver alloc_conf text)
fi
if ! [[ "$seconds" =~ ^[1-9][0-9]*$ ]]; then
  echo "fuzz.sh: SECONDS_PER_TARGET must be a positive whole number, got '$seconds'" >&2
  exit 2
fi

launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ "${launcher[@]}" \
  -DMEMPLAN_FUZZ=ON -DMEMPLAN_CUDA=OFF -DMEMPLAN_BUILD_TESTS=OFF -DMEMPLAN_BUILD_BENCH=OFF \
  -DMEMPLAN_WERROR=ON >/dev/null
cmake --build build-fuzz -j "$(memplan_jobs)" --target "${targets[@]/#/fuzz_}"

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
rows=()
total_findings=0
for t in "${targets[@]}"; do
  work="build-fuzz/corpus/$t"
  findings="build-fuzz/findings/$t"
  rm -rf "$findings"
  mkdir -p "$work" "$findings"
  [[ -d "fuzz/corpus/$t" ]] && cp -n fuzz/corpus/"$t"/* "$work"/ 2>/dev/null || true
  log="build-fuzz/fuzz_$t.log"
  echo "== fuzz_$t for ${seconds}s =="
  # One process; libFuzzer stops at the first finding, so a crash ends the run early.
  set +e
  "build-fuzz/fuzz/fuzz_$t" "$work" -max_total_time="$seconds" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$findings/" >"$log" 2>&1
  rc=$?
  set -e
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  found=$(find "$findings" -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | wc -l)
  total_findings=$((total_findings + found))
  rows+=("$(printf '%-16s %12s %9s %6s' "$t" "$execs" "$found" "$rc")")
  if ((rc != 0)); then tail -n 40 "$log"; fi
done
echo
printf '%-16s %12s %9s %6s\n' target executions findings exit
printf '%s\n' "${rows[@]}"
echo "findings in build-fuzz/findings/ (total $total_findings); logs in build-fuzz/fuzz_*.log"
((total_findings == 0))
