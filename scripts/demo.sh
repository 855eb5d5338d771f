#!/usr/bin/env bash
# `make demo`: a 2x2 lab, a NIC failure on h0 and its recovery, seen through shiftctl; then the lab
# goes away again, also on Ctrl-C or on an error (EXIT trap).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="$(pwd)/${VENV:-.venv}/bin"
LAB="${SHIFT_DEMO_LAB:-demo}"

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
on_h0() { "$BIN/shift-lab" exec --name "$LAB" h0 -- "$@"; }

if [ "$(id -u)" -ne 0 ]; then
    echo "demo: needs root for network namespaces; try: sudo make demo" >&2
    exit 1
fi

follower=""
events=""
cleanup() {
    local status=$?
    trap - EXIT INT TERM
    if [ -n "$follower" ]; then
        kill "$follower" 2>/dev/null || true
        wait "$follower" 2>/dev/null || true
    fi
    say "taking the lab down"
    "$BIN/shift-lab" down --name "$LAB" || true
    [ -n "$events" ] && rm -f "$events"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "bringing up a lab of 2 hosts x 2 NICs"
"$BIN/shift-lab" up --name "$LAB" --hosts 2 --nics 2

say "h0: shiftctl nics"
on_h0 shiftctl nics

events="$(mktemp)"
say "h0: shiftctl events --follow, in the background (its lines start with 'events>')"
# Not through on_h0: run directly, $! is the PID that ends up being shiftctl (exec all the way
# down). Each event is shown as it arrives and kept in a file for the summary.
PYTHONUNBUFFERED=1 "$BIN/shift-lab" exec --name "$LAB" h0 -- shiftctl events --follow --backlog 0 \
    > >(tee "$events" | sed -u 's/^/    events> /') 2>&1 &
follower=$!
sleep 1

say "h0: shiftctl fail-nic mlx5_0 (link down)"
on_h0 shiftctl fail-nic mlx5_0
sleep 1

say "rail switch 0: its port to h0 has lost carrier (NO-CARRIER)"
ip -n "$LAB-rail0" link show h0

say "h0: shiftctl nics"
on_h0 shiftctl nics

say "h0: shiftctl recover-nic mlx5_0"
on_h0 shiftctl recover-nic mlx5_0
sleep 2 # the lab's health.hold_down_seconds is 1.0: the NIC counts as UP once stable that long
ip -n "$LAB-rail0" link show h0
on_h0 shiftctl nics

say "what 'shiftctl events --follow' on h0 saw"
cat "$events"
if ! grep -q "mlx5_0 (ens1f0np0) UP -> DOWN operator_down" "$events" \
    || ! grep -q "mlx5_0 (ens1f0np0) DOWN -> UP recovered" "$events"; then
    echo "demo: the failure and the recovery did not both reach the event stream" >&2
    exit 1
fi
say "demo finished: the NIC failed, every subscriber heard it, and it came back"
