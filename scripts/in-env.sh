#!/usr/bin/env bash
# Run a command inside the cookbook's own virtual environment, building it first if needed.
# The environment lives in the cache folder (outside the checkout), keyed by Python version and
# by the hash of pyproject.toml and requirements.lock (the versions it resolved, installed as constraints),
# so a fresh clone or a CI run reuses it and builds the same set. vLLM is never installed here.
set -euo pipefail
quiet() {  # run a pip step; show its output only if it fails
  local log; log="$(mktemp)"
  if ! "$@" >"$log" 2>&1; then grep -v "is ignored: it is neither" "$log" >&2; rm -f "$log"; return 1; fi
  rm -f "$log"
}
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${COOKBOOK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gaudi-cookbook}"
python="${COOKBOOK_PYTHON:-python3}"
pyver="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
key="$(cat "$here/pyproject.toml" "$here/requirements.lock" | sha256sum | cut -c1-12)"
venv="$cache/envs/cookbook-py$pyver-$key"
if [ ! -f "$venv/.complete" ]; then
  echo "cookbook: building the cookbook environment in $venv (once)" >&2
  rm -rf "$venv"
  mkdir -p "$cache/envs"
  "$python" -m venv "$venv"
  quiet "$venv/bin/pip" install -q --upgrade pip
  quiet "$venv/bin/pip" install -q -c "$here/requirements.lock" -e "$here[dev]"
  touch "$venv/.complete"
fi
# Several checkouts may share this environment (a developer's tree and a fresh clone's tests at once): each one
# imports its own code because its folder comes first on the path. The editable install only provides the
# `cookbook` command and the dependencies; it is never re-pointed.
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$venv/bin:$PATH"
export COOKBOOK_CACHE="$cache"
export HF_HUB_OFFLINE=1
# mypy's incremental cache beside the environment, not in the checkout: a fresh clone's `make lint` and hygiene test
# re-check only what differs from the last run (mypy compares each file's hash when its mtime is new).
export MYPY_CACHE_DIR="${MYPY_CACHE_DIR:-$cache/mypy/$(basename "$venv")}"
# The `gaudi-cookbook` Jupyter kernel that papermill and `make lab` use: installed where it is absent.
"$here/scripts/install-kernel.sh" --if-missing || echo "cookbook: warning: the Jupyter kernel gaudi-cookbook is not installed" >&2
exec "$@"
