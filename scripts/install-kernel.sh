#!/usr/bin/env bash
# Install the `gaudi-cookbook` Jupyter kernel ("Gaudi Cookbook"): the cookbook's environment as scripts/in-env.sh
# sets it up (its venv's python, a checkout on PYTHONPATH, COOKBOOK_CACHE, HF_HUB_OFFLINE=1, the venv's bin on PATH).
#
#   scripts/in-env.sh scripts/install-kernel.sh              (`make setup` and `make lab`: (re)point both copies here)
#   scripts/in-env.sh scripts/install-kernel.sh --if-missing (in-env.sh itself, at every call: what is absent, or
#                                                             points at another checkout or venv, is (re)pointed here)
#
# Two copies of one spec, so every Jupyter finds it: the venv's own folder (what `jupyter kernelspec install
# --sys-prefix` writes: papermill and JupyterLab run from the venv look there first) and the user's kernel folder
# (a JupyterLab started from another environment). A file is rewritten only when its content differs, atomically,
# so running this twice changes nothing and a Jupyter reading the spec meanwhile never sees half a file.
#
# The kernel keeps a checkout that is already first on PYTHONPATH: papermill, `make lab` and the tests run inside
# scripts/in-env.sh of their own checkout, whose code the kernel then imports (checkouts share a venv); from another
# environment (a JupyterLab started elsewhere), the kernel imports the checkout that last ran in-env.sh. One kernel
# name, re-pointed, rather than one per checkout: every notebook names `gaudi-cookbook` in its metadata, and a name
# per checkout would make the notebooks differ between clones.
set -euo pipefail
mode="${1:-}"
case "$mode" in ""|--if-missing) ;; *) echo "usage: $0 [--if-missing]" >&2; exit 2 ;; esac
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="$(command -v python)" || { echo "error: no python on PATH: run this through scripts/in-env.sh" >&2; exit 2; }
venv="$(cd "$(dirname "$python")/.." && pwd)"
cache="${COOKBOOK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gaudi-cookbook}"
name=gaudi-cookbook
# Where jupyter_core looks: {sys.prefix}/share/jupyter and the user's data folder (JUPYTER_DATA_DIR, else XDG's).
targets=("$venv/share/jupyter/kernels/$name" "${JUPYTER_DATA_DIR:-${XDG_DATA_HOME:-$HOME/.local/share}/jupyter}/kernels/$name")

quote() { printf "'%s'" "${1//\'/\'\\\'\'}"; }  # a POSIX-sh single-quoted word

kernel_json='{
 "argv": ["/bin/sh", "{resource_dir}/kernel.sh", "-f", "{connection_file}"],
 "display_name": "Gaudi Cookbook",
 "language": "python",
 "metadata": {"debugger": true}
}'
kernel_sh="#!/bin/sh
# The gaudi-cookbook kernel, written by $here/scripts/install-kernel.sh (rerun it to re-point).
# A caller inside the cookbook env already has its own checkout first on PYTHONPATH and keeps it; else this one.
export PYTHONPATH=\"\${PYTHONPATH:+\$PYTHONPATH:}\"$(quote "$here")
export PATH=$(quote "$venv/bin")\":\$PATH\"
[ -n \"\${COOKBOOK_CACHE:-}\" ] || COOKBOOK_CACHE=$(quote "$cache")
export COOKBOOK_CACHE
export HF_HUB_OFFLINE=1
exec $(quote "$venv/bin/python") -m ipykernel_launcher \"\$@\"
"

write() {  # write FILE CONTENT: only when it differs, through a temporary file renamed over it
  local file="$1" content="$2" tmp
  if [ -f "$file" ] && [ "$(cat "$file")" == "${content%$'\n'}" ]; then return 1; fi
  tmp="$(mktemp "$file.XXXXXX")"
  printf '%s\n' "${content%$'\n'}" >"$tmp"
  chmod 644 "$tmp"
  mv -f "$tmp" "$file"
}

recorded() {  # the checkout a kernel.sh was written by (its second line), or nothing
  sed -n 's|^# The gaudi-cookbook kernel, written by \(.*\)/scripts/install-kernel.sh (rerun it to re-point)\.$|\1|p' "$1" 2>/dev/null
}

for dir in "${targets[@]}"; do
  if [ "$mode" == --if-missing ] && [ -f "$dir/kernel.json" ] && [ -f "$dir/kernel.sh" ]; then
    was="$(recorded "$dir/kernel.sh")"
    # Pointing here already (this checkout, this venv's python): left alone, whatever else differs (the cache).
    if [ "$was" == "$here" ] && grep -qF "exec $(quote "$venv/bin/python") " "$dir/kernel.sh"; then continue; fi
    echo "cookbook: Jupyter kernel $name in $dir pointed at ${was:-another checkout}; re-pointing it at $here" >&2
  fi
  mkdir -p "$dir"
  changed=0
  write "$dir/kernel.json" "$kernel_json" && changed=1
  write "$dir/kernel.sh" "$kernel_sh" && changed=1
  if [ "$changed" == 1 ]; then echo "cookbook: Jupyter kernel $name (Gaudi Cookbook) installed in $dir" >&2; fi
done
