#!/usr/bin/env bash
# `make test`: the unit run (every core, pytest-xdist) and the server tests in N lanes (scripts/test-lanes.sh), at
# once. The unit run leaves a third of the two cores idle and the lanes begin with vLLM start-ups, so started
# together they fill the cores from the first second. The unit run prints live; the lanes' output follows it, live
# from there on. Exit status: the unit run's if it failed, else the lanes'.
#
#   scripts/in-env.sh scripts/test-all.sh 2
#   scripts/in-env.sh scripts/test-all.sh 0     # the unit run alone (`make unit`)
#
# Ctrl-C reaches the unit run and every lane (one process group; each pytest takes Ctrl-C back, tests/terminal.py),
# and each lane's guard stops its servers: measured, nothing left running. A SIGTERM to this script (a CI runner's
# timeout) stops the unit run and the lanes at once: every child runs in the background and the script only waits,
# because bash runs a trap only after its foreground command ends.
set -uo pipefail
lanes="${1:?usage: $0 N}"
unit=(python -m pytest -q -m "not integration and not sim_image" -n auto)
if [ "$lanes" = 0 ]; then exec "${unit[@]}"; fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
log="$(mktemp)"
"$here/test-lanes.sh" "$lanes" -m "integration or sim_image" >"$log" 2>&1 &
lanes_pid=$!
children=("$lanes_pid")
# test-lanes.sh, a background job of this script, starts with SIGINT ignored: it is stopped with SIGTERM.
trap 'kill -TERM "${children[@]}" 2>/dev/null; wait; rm -f "$log"; exit 130' INT TERM
"${unit[@]}" &
children+=($!)
wait "$!"
unit_status=$?
tail -n +1 --pid="$lanes_pid" -f "$log" &
children+=($!)
wait "$!"
wait "$lanes_pid"
status=$?
rm -f "$log"
if [ "$unit_status" -ne 0 ]; then exit "$unit_status"; fi
exit "$status"
