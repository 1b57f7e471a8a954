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
# and each lane's guard stops its servers: measured, nothing left running. A SIGTERM to this script stops the lanes
# through test-lanes.sh.
set -uo pipefail
lanes="${1:?usage: $0 N}"
unit_run() { python -m pytest -q -m "not integration and not sim_image" -n auto; }
if [ "$lanes" = 0 ]; then unit_run; exit; fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
log="$(mktemp)"
"$here/test-lanes.sh" "$lanes" -m "integration or sim_image" >"$log" 2>&1 &
lanes_pid=$!
# test-lanes.sh, a background job of this script, starts with SIGINT ignored: it is stopped with SIGTERM.
trap 'kill -TERM "$lanes_pid" 2>/dev/null; wait "$lanes_pid"; rm -f "$log"; exit 130' INT TERM
unit_run
unit=$?
tail -n +1 --pid="$lanes_pid" -f "$log"
wait "$lanes_pid"
status=$?
rm -f "$log"
if [ "$unit" -ne 0 ]; then exit "$unit"; fi
exit "$status"
