#!/usr/bin/env bash
# JupyterLab on notebooks/ with the `gaudi-cookbook` kernel, bound to 127.0.0.1, behind a token (`make lab`).
#
#   scripts/in-env.sh scripts/lab.sh [JUPYTER LAB OPTIONS...]     (e.g. --ServerApp.port=8899)
#
# COOKBOOK_LAB_ROOT serves another folder than notebooks/ (the browser test serves a copy).
# Runs inside the cookbook env (the kernel spec is (re)pointed at this checkout and env first). Jupyter makes a
# random token and prints the URL that carries it; reach it from another machine through an SSH tunnel
# (`ssh -L 8888:127.0.0.1:8888 box`), never by binding elsewhere. Nothing is fetched from the network: no update
# check, no news feed, no extension manager search on PyPI. tests/test_browser.py starts JupyterLab through this script, with its own port, token and
# folders, so the test drives what `make lab` serves.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$here/scripts/install-kernel.sh"
as_root=()
if [ "$(id -u)" == 0 ]; then as_root=(--allow-root); fi  # CI and containers run as root
exec jupyter lab --no-browser "${as_root[@]}" \
  --ServerApp.ip=127.0.0.1 \
  --ServerApp.root_dir="${COOKBOOK_LAB_ROOT:-$here/notebooks}" \
  --MappingKernelManager.default_kernel_name=gaudi-cookbook \
  --LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate \
  --LabApp.news_url=None \
  --LabApp.extension_manager=readonly \
  "$@"
