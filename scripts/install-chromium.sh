#!/usr/bin/env bash
# Debian's Chromium for the browser test (tests/test_browser.py) and scripts/screenshot_report.sh, installed once.
#
#   scripts/install-chromium.sh        (`make test` runs it as part of its set-up; a no-op when it is installed)
#
# The browser comes from Debian's own package `chromium` (/usr/bin/chromium), never from a test tool's download:
# Playwright drives it by path and nothing is fetched at run time. Installing needs root (CI runs as root); without
# root this says what to run and fails.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "error: /usr/bin/chromium is missing and installing it needs root: sudo apt-get install -y chromium" >&2
  exit 1
fi
echo "install-chromium: installing Debian's chromium (once): apt-get update && apt-get install -y chromium" >&2
apt-get update -q >&2
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core >&2
echo "install-chromium: $(/usr/bin/chromium --version 2>/dev/null || echo chromium)" >&2
