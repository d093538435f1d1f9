#!/usr/bin/env bash
# The install test (ctest: install.find_package): installs a memplan build into a fresh prefix,
# then configures, builds and runs the outside project beside this script against it, as a user
# of find_package(memplan) would.
#   run.sh BUILD_DIR CXX_COMPILER BUILD_TYPE EXPECT_CUDA(ON|OFF) [FLAGS]
# FLAGS go to the outside project's compile and link (the sanitizer build's -fsanitize=..., which
# memplan's exported targets deliberately do not carry).
set -euo pipefail
if (($# < 4)); then
  echo "usage: run.sh BUILD_DIR CXX_COMPILER BUILD_TYPE EXPECT_CUDA [FLAGS]" >&2
  exit 2
fi
build="$1" cxx="$2" build_type="$3" expect_cuda="$4" flags="${5:-}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/memplan-install-test.XXXXXX")"
trap 'rm -rf "$work"' EXIT
log="$work/log"

step() {  # step WHAT COMMAND...: runs it quietly; on failure shows its output and stops
  local what="$1"
  shift
  echo "install test: $what"
  if ! "$@" >"$log" 2>&1; then
    cat "$log"
    echo "install test: FAILED: $what" >&2
    exit 1
  fi
}

step "cmake --install into $work/prefix" cmake --install "$build" --config "$build_type" --prefix "$work/prefix"
for f in lib/cmake/memplan/memplanConfig.cmake lib/cmake/memplan/memplanConfigVersion.cmake \
  include/memplan/planner/memory_plan.h lib/libmemplan_planner.a bin/memplan; do
  [[ -e "$work/prefix/$f" ]] || { echo "install test: FAILED: $f was not installed" >&2; exit 1; }
done
step "configure the outside project" cmake -S "$here" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE="$build_type" -DEXPECT_CUDA="$expect_cuda" \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags"
step "build it" cmake --build "$work/build"
output="$("$work/build/plan_mlp")" || { echo "install test: FAILED: plan_mlp exited with $?" >&2; exit 1; }
echo "$output"
[[ "$output" =~ ^arena_bytes\ [1-9][0-9]*$'\n'cuda_device_present\ [01]$'\n'train_spec_refused\ 1$ ]] ||
  { echo "install test: FAILED: unexpected output" >&2; exit 1; }
# The Python package (when the build has it: MEMPLAN_PYTHON names the interpreter, MEMPLAN_PYTHON_DIR
# its folder under the prefix): installed where that python3 looks under /usr/local, and it imports
# and answers from the prefix alone.
if [[ -n "${MEMPLAN_PYTHON:-}" ]]; then
  site="$work/prefix/$MEMPLAN_PYTHON_DIR"
  [[ -e "$site/memplan/__init__.py" && -e "$site/memplan/torch.py" ]] ||
    { echo "install test: FAILED: the Python package is not under $site" >&2; exit 1; }
  "$MEMPLAN_PYTHON" -c "import site, sys; sys.exit(0 if '/usr/local/$MEMPLAN_PYTHON_DIR' in site.getsitepackages() else 1)" ||
    { echo "install test: FAILED: $MEMPLAN_PYTHON does not look in /usr/local/$MEMPLAN_PYTHON_DIR" >&2; exit 1; }
  fits="$(cd "$work" && PYTHONPATH="$site" "$MEMPLAN_PYTHON" -c \
    "import memplan; print(memplan.fit(model='mlp', device_memory='1GiB').fits, memplan.__file__)")"
  [[ "$fits" == "True $site/memplan/__init__.py" ]] || { echo "install test: FAILED: import memplan gave '$fits'" >&2; exit 1; }
  echo "python package: $fits"
fi
echo "install test: passed"
