#!/usr/bin/env bash
# The whole test suite: install what memplan needs, build (CUDA code included when the toolkit is
# at /usr/local/cuda), run every test; build the documentation site; compile the libraries once
# more file by file; then rebuild the tests with AddressSanitizer + UndefinedBehaviorSanitizer and
# run them again. Warnings are errors in every build.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/deps.sh
memplan_install_deps "${MEMPLAN_TEST_PACKAGES[@]}"

stage() { echo "== $1 (at ${SECONDS}s) =="; }
stage "build (Release, -Werror)"
memplan_build build -DMEMPLAN_BUILD_TESTS=ON -DMEMPLAN_BUILD_BENCH=ON -DMEMPLAN_WERROR=ON
# Tests run in parallel processes, so each keeps to one CPU thread (memplan's thread pool takes
# its default count from OMP_NUM_THREADS): more would only oversubscribe the cores, and no test
# measures speed. Tests that need several threads set them.
export OMP_NUM_THREADS=1
stage "tests"
ctest --test-dir build --output-on-failure -j "$(memplan_jobs)"

stage "docs site (mkdocs build --strict)"
# Every page in the nav, every link between pages: a broken one fails the build. The site is
# built outside the repository. The README stays short and links into the site.
site="$(mktemp -d)"
mkdocs build --strict --quiet --site-dir "$site"
rm -rf "$site"
readme_lines=$(wc -l < README.md)
if ((readme_lines > 250)); then
  echo "README.md has $readme_lines lines; keep it at 250 or fewer and move the detail into docs/ (the site)" >&2
  exit 1
fi

stage "libraries without unity build"
# The unity builds compile sources eight to a translation unit, where one file's includes cover
# for another's. Here each source of the installed libraries compiles alone, so a missing
# include fails the suite. No optimisation (the code is only checked, not run) and no CUDA, to
# keep this stage short.
cmake -S . -B build-nounity -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-O0 -DCMAKE_UNITY_BUILD=OFF \
  -DMEMPLAN_CUDA=OFF -DMEMPLAN_BUILD_TESTS=OFF -DMEMPLAN_BUILD_BENCH=OFF -DMEMPLAN_WERROR=ON >/dev/null
cmake --build build-nounity -j "$(memplan_jobs)" --target memplan_libraries

stage "build (ASan + UBSan)"
# The sanitizer build skips the CUDA backend: the CUDA runtime is not ASan-instrumented. -g1
# keeps the line tables a sanitizer report prints and drops the variable descriptions, which
# cut compile time by about 30%.
# The cases run as 32 shards of one process each (see tests/CMakeLists.txt): an ASan process
# takes a third of a second to start, which a thousand one-case processes would pay each.
memplan_build build-sanitize -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" -DMEMPLAN_SANITIZE=ON -DMEMPLAN_CUDA=OFF \
  -DMEMPLAN_TEST_SHARDS=32 -DMEMPLAN_BUILD_TESTS=ON -DMEMPLAN_BUILD_BENCH=OFF -DMEMPLAN_WERROR=ON
stage "tests under ASan + UBSan"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-sanitize --output-on-failure -j "$(memplan_jobs)"
echo "== all tests passed in ${SECONDS}s =="
