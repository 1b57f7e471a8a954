#!/usr/bin/env bash
# Screenshot a run's HTML report (index.html) with headless Chromium, and check that the page a browser renders
# holds the Verified table and the throughput figure.
#
#   scripts/screenshot_report.sh RUN_DIR [OUT.png]      (OUT defaults to RUN_DIR/index.png)
#
# Debian packages Chromium as `chromium`; if no Chromium is installed this script installs it with
# scripts/install-chromium.sh (apt-get install chromium; needs root) and says so. The browser runs with a fresh profile
# that is deleted afterwards, and with background networking, updates and sync off: the report loads nothing
# from the network.
set -euo pipefail
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 RUN_DIR [OUT.png]" >&2
  exit 2
fi
run_dir="$(cd "$1" 2>/dev/null && pwd)" || { echo "error: RUN_DIR: $1 is not a folder" >&2; exit 2; }
index="$run_dir/index.html"
[ -f "$index" ] || { echo "error: RUN_DIR: no index.html in $run_dir" >&2; exit 2; }
out="${2:-$run_dir/index.png}"

browser="$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)"
if [ -z "$browser" ]; then
  echo "screenshot_report: no Chromium found; installing Debian's (scripts/install-chromium.sh)" >&2
  "$(dirname "${BASH_SOURCE[0]}")/install-chromium.sh"
  browser=/usr/bin/chromium
fi

profile="$(mktemp -d)"
trap 'rm -rf "$profile"' EXIT
flags=(--headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update
       --disable-sync --no-first-run --user-data-dir="$profile" --hide-scrollbars --virtual-time-budget=5000)

# What the browser rendered (after parsing and scripts), checked for the two things a reader comes for.
dom="$("$browser" "${flags[@]}" --dump-dom "file://$index" 2>/dev/null)"
missing=()
grep -q "<h2>Verified</h2>" <<<"$dom" || missing+=("the Verified table")
grep -q 'alt="throughput" src="data:image/png;base64,' <<<"$dom" || missing+=("the throughput figure")
if [ ${#missing[@]} -gt 0 ]; then
  echo "error: $index as rendered lacks: ${missing[*]}" >&2
  exit 1
fi

"$browser" "${flags[@]}" --window-size=1400,3000 --screenshot="$out" "file://$index" >/dev/null 2>&1
[ -s "$out" ] || { echo "error: Chromium wrote no screenshot to $out" >&2; exit 1; }
echo "screenshot: $out ($("$browser" --version 2>/dev/null || echo chromium))"
