#!/usr/bin/env bash
# Installs memplan's build and run dependencies from Debian's packages (run as root).
# Sourced by scripts/train.sh and scripts/test.sh; safe to run repeatedly.
set -euo pipefail

MEMPLAN_PACKAGES=(
  build-essential cmake pkg-config
  libeigen3-dev libgtest-dev zlib1g-dev nlohmann-json3-dev libcli11-dev
  libopenmpi-dev openmpi-bin
  dataset-fashion-mnist fortunes
  libonnx-dev libprotobuf-dev
  python3-dev pybind11-dev
)
# Only the test suite needs these: a browser to check the HTML reports, PyTorch for the tests
# of the Python package's PyTorch bridge (memplan.torch), and MkDocs to build the documentation
# site (mkdocs.yml, docs/).
MEMPLAN_TEST_PACKAGES=(chromium python3-torch python3-torchvision mkdocs mkdocs-material)
# Only scripts/fuzz.sh needs these: clang with libFuzzer and its sanitizer runtimes.
MEMPLAN_FUZZ_PACKAGES=(clang libclang-rt-dev)

# memplan_install_deps [extra packages...]
memplan_install_deps() {
  local missing=()
  for p in "${MEMPLAN_PACKAGES[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "memplan: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

# The cores this process may run on, for parallel builds and test runs. Not plain nproc: GNU
# nproc answers OMP_NUM_THREADS when that is set (scripts/test.sh sets it to 1 for the tests,
# and users often set it for CPU frameworks), and every later build and ctest then ran one job
# at a time.
memplan_jobs() {
  env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc
}

# Configures and builds into $1 with extra CMake arguments after it. A unity build (sources
# compiled eight to a translation unit) parses the heavy headers — CLI11, nlohmann/json,
# GoogleTest — once per batch rather than once per file: a clean build takes about 40% of the
# time. Incremental development builds may leave it off (the default in CMakeLists.txt).
# These builds run where they are built, so they are also tuned for this CPU (-march=native,
# off by default in CMakeLists.txt so an installed memplan runs on other machines too). Later
# arguments override both.
memplan_build() {
  local dir="$1"
  shift
  cmake -S "$(dirname "${BASH_SOURCE[0]}")/.." -B "$dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_UNITY_BUILD=ON -DMEMPLAN_NATIVE=ON \
    "$@" >/dev/null
  cmake --build "$dir" -j "$(memplan_jobs)"
}
