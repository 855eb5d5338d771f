"""A tiny run of bench/soak.py, so the soak does not rot: a lab, agents, mappings, NIC faults, no errors.

2 hosts (one two-way stream), 4 agent processes with 2 agents each, 400 mappings, a fault every 8 s for
16 s: h0's mlx5_0, then h1's, each down for 4 s, so each failback has finished before the next fault.
The soak itself counts errors (stream messages out of order or lost, error completions, failed shiftctl
calls, mappings missing from etcd, agents that had to reconnect, daemons restarted).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.lab, pytest.mark.timeout(240)]

SOAK = Path(__file__).parents[2] / "bench" / "soak.py"


def test_a_short_soak_fails_over_without_errors(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    args = ["--duration", "16", "--fault-every", "8", "--hosts", "2", "--procs", "2", "--agents", "2"]
    result = subprocess.run(
        [sys.executable, str(SOAK), *args, "--mappings", "50", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    soak = json.loads(out.read_text())
    assert soak["errors"] == []
    assert (soak["agent_processes"], soak["agents"], soak["mappings"], soak["streams"]) == (4, 8, 400, 1)
    assert soak["mappings_in_etcd"] == [400, 400]
    assert soak["faults"] == 2
    assert soak["failovers"] == soak["failbacks"] == 4  # each fault moves both sides of the stream, and back
    assert soak["messages"] > 0
    assert all(start > 0 and end > 0 for start, end in soak["rss_kib"].values())
    # sampled at the start and the end at least (a minute apart in a long soak), in time order
    for series in soak["rss_kib_series"].values():
        assert len(series) >= 2 and series[0][0] == 0 and series[-1][0] >= 16
        assert all(kib > 0 for _, kib in series)
    assert soak["etcd_writes_per_second"]["etcd_mvcc_put_total"] > 0  # the NICs' states, at least
    # and the table an operator reads
    rows = ("failovers done", "errors seen", "shiftd RSS on h1, start / 1 min / end (MiB)", "etcd writes/s")
    for row in rows:
        assert row in result.stdout
