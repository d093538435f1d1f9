#!/usr/bin/env bash
# `python3 -m pip install --no-build-isolation .` from the clone into a fresh prefix, offline, then
# `import memplan` from another folder: the package as a Python user installs it.
# Usage: pip_install.sh SOURCE_DIR CMAKE_BUILD_DIR PYTHON
# The CMake build tree given is reused (setup.py's MEMPLAN_CMAKE_BUILD_DIR), so the install builds
# nothing the suite has not built already.
set -euo pipefail
source_dir="$1"
build_dir="$2"
python="$3"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

MEMPLAN_CMAKE_BUILD_DIR="$build_dir" PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
  "$python" -m pip install --no-build-isolation --no-deps --prefix "$work/prefix" "$source_dir" >"$work/pip.log" 2>&1 || {
  cat "$work/pip.log"
  echo "pip install failed" >&2
  exit 1
}
init="$(find "$work/prefix" -path '*/memplan/__init__.py' | head -n 1)"
if [[ -z "$init" ]]; then
  echo "pip installed no memplan/__init__.py under $work/prefix:" >&2
  find "$work/prefix" >&2
  exit 1
fi
site="$(dirname "$(dirname "$init")")"
mkdir "$work/elsewhere"
cd "$work/elsewhere"
PYTHONPATH="$site" PYTHONDONTWRITEBYTECODE=1 "$python" - "$site" <<'PY'
import os
import sys

import memplan

site = sys.argv[1]
assert os.path.realpath(memplan.__file__).startswith(os.path.realpath(site)), memplan.__file__
assert os.path.realpath(memplan._memplan.__file__).startswith(os.path.realpath(site)), memplan._memplan.__file__
assert "torch" not in sys.modules, "import memplan imported torch"
answer = memplan.fit(model="mlp", batch=8, device_memory="1GiB")
assert answer.fits and answer.arena_bytes > 0, answer.to_dict()
print(f"memplan {memplan.__version__} from {os.path.dirname(memplan.__file__)}: mlp batch 8 arena {answer.arena_bytes} B")
PY
