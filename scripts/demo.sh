#!/usr/bin/env bash
# `make demo`: GPT-2 trained with DDP over the "shift" backend on a 2x2 lab, with `shiftctl fail-nic
# mlx5_0` on h0 partway through and `recover-nic` later, then a report and a PNG (demo-out/). The work
# is examples/gpt2/demo.py, which also takes the lab down at the end, on an error, on Ctrl-C and on TERM.
# Arguments go to demo.py (see --help); SHIFT_DEMO_LAB names the lab (default: demo).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
    echo "demo: needs root for network namespaces; try: sudo make demo" >&2
    exit 1
fi
exec "$(pwd)/${VENV:-.venv}/bin/python" examples/gpt2/demo.py --name "${SHIFT_DEMO_LAB:-demo}" "$@"
