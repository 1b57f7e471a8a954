#!/usr/bin/env bash
# Resolve pyproject.toml's dependencies (and the dev extra) afresh in a scratch venv and write requirements.lock,
# the versions scripts/in-env.sh installs as constraints (its venv key includes the file). Run after changing
# pyproject.toml's dependencies: `make lock`, then commit both.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${COOKBOOK_PYTHON:-python3}"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
"$python" -m venv "$scratch/venv"
"$scratch/venv/bin/pip" install -q --upgrade pip >/dev/null
"$scratch/venv/bin/pip" install -q -e "$here[dev]" >/dev/null
{
  echo "# What the cookbook's venv resolves from pyproject.toml (its dependencies and the dev extra), pinned: scripts/in-env.sh"
  echo "# installs with these as constraints, and its venv key includes this file. Refresh: make lock (after a pyproject change)."
  "$scratch/venv/bin/pip" freeze --exclude-editable
} > "$here/requirements.lock.new"
mv "$here/requirements.lock.new" "$here/requirements.lock"
echo "wrote $here/requirements.lock ($(grep -c '==' "$here/requirements.lock") pins)"
