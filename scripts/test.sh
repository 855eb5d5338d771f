#!/usr/bin/env bash
# `make test`: the host's suite and, at the same time, `make test-rxe` (the verbs suites, the failover cases
# and the rxe lab in Soft-RoCE VMs, shiftlab/rxe). They run side by side because each mostly waits (the
# host's suite on timeouts and daemons, the VM on TCG's emulation): one after the other they would pass the
# suite's 25-minute budget. The VMs' output goes to a log, shown in full if it failed and as pytest's
# summary lines if it passed; the exit code is non-zero if either part failed. Arguments go to the host's
# pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="$(pwd)/${VENV:-.venv}/bin/python"

log="$(mktemp -t shift-test-rxe.XXXXXX.log)"
started=$SECONDS
setsid make --no-print-directory test-rxe >"$log" 2>&1 &
rxe=$!
echo "test: the Soft-RoCE VM runs beside the host's suite (make test-rxe, pid $rxe, log $log)"

# ^C or TERM: the VM's runner powers its guest off on TERM (shiftlab.rxe); only the group this script made.
stop_rxe() {
    kill -TERM -- "-$rxe" 2>/dev/null && wait "$rxe" 2>/dev/null
    rm -f "$log"
}
trap 'stop_rxe; exit 130' INT TERM

"$PY" -m pytest -q "$@"
host=$?

if kill -0 "$rxe" 2>/dev/null; then
    echo "test: the host's suite is done; waiting for the Soft-RoCE VM ($(( SECONDS - started )) s so far)"
fi
wait "$rxe"
vm=$?
trap - INT TERM

if [ "$vm" -ne 0 ]; then
    echo "test: make test-rxe failed (exit $vm); its output:"
    cat "$log"
else
    grep -E '^=*.* (passed|failed|error)' "$log" | sed 's/^/test: make test-rxe, on Soft-RoCE in a VM: /'
fi
rm -f "$log"
echo "test: host suite exit $host, Soft-RoCE VM exit $vm, $(( SECONDS - started )) s in all"
[ "$host" -eq 0 ] && [ "$vm" -eq 0 ]
