#!/usr/bin/env bash
# Renders the HTML reports the documentation shows into docs/images/ with headless Chromium:
# `memplan compare --html` on the character GPT and `memplan replay --html` on one of the test
# suite's snapshot fixtures. Run after a build (scripts/train.sh or scripts/test.sh make one);
# needs Debian's chromium (scripts/deps.sh lists it among the test packages).
#
#   bash scripts/docs_screenshots.sh [path/to/memplan]     # default build/tools/memplan
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

memplan="${1:-build/tools/memplan}"
chromium="${CHROMIUM:-/usr/bin/chromium}"
[[ -x "$memplan" ]] || { echo "docs_screenshots: no memplan at $memplan (build first, or pass its path)" >&2; exit 2; }
[[ -x "$chromium" ]] || { echo "docs_screenshots: no chromium at $chromium (apt-get install chromium)" >&2; exit 2; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p docs/images

# The reports: fixed models, sizes and inputs, so a rerun draws the same pictures.
"$memplan" compare --model gpt --batch 32 --html "$work/compare.html" >/dev/null
"$memplan" replay tests/data/snapshots/late_start.pickle --html "$work/replay.html" >/dev/null

# shot NAME.html OUT.png [HEIGHT]: a 1280-pixel-wide screenshot of the page's top, 900 pixels
# tall unless HEIGHT says otherwise.
shot() {
  local profile
  profile="$(mktemp -d "$work/profile.XXXXXX")"
  "$chromium" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$profile" --hide-scrollbars --window-size="1280,${3:-900}" \
    --screenshot="$2" "file://$work/$1" 2>/dev/null >/dev/null
  [[ -s "$2" ]] || { echo "docs_screenshots: chromium wrote no $2" >&2; exit 1; }
  echo "wrote $2"
}
# Both reports' layouts start below their tables: these heights show the tables and the layouts.
shot compare.html docs/images/compare_report.png 1130
shot replay.html docs/images/replay_report.png 1400
