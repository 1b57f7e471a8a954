#!/usr/bin/env bash
# Run one pytest selection as N lanes at once (tests/lanes.py): lane 1's output live, the others' kept and printed
# after lane 1 ends. Exit status: the first failing lane's.
#
#   scripts/in-env.sh scripts/test-lanes.sh 2 -m "integration or sim_image"
#
# Ctrl-C stops every lane (each lane's guard then stops its servers). So does a SIGTERM to this script, at once:
# every lane runs in the background and the script only waits, because bash runs a trap only after its foreground
# command ends.
set -uo pipefail
lanes="${1:?usage: $0 N [pytest arguments...]}"
shift
case "$lanes" in ''|*[!0-9]*) echo "error: N: expected a number of lanes, got '$lanes'" >&2; exit 2 ;; esac
logs="$(mktemp -d)"
pids=()
first=""
trap 'kill $first "${pids[@]}" 2>/dev/null; wait; rm -rf "$logs"; exit 130' INT TERM
for k in $(seq 2 "$lanes"); do
  python -m pytest -q "$@" --lane "$k/$lanes" >"$logs/lane$k.log" 2>&1 &
  pids+=($!)
done
python -m pytest -q "$@" --lane "1/$lanes" &
first=$!
wait "$first"
status=$?
for i in "${!pids[@]}"; do
  k=$((i + 2))
  wait "${pids[$i]}"
  code=$?
  echo "== lane $k of $lanes (exit $code)"
  cat "$logs/lane$k.log"
  if [ "$status" -eq 0 ] && [ "$code" -ne 0 ] && [ "$code" -ne 5 ]; then status=$code; fi
done
rm -rf "$logs"
exit "$status"
