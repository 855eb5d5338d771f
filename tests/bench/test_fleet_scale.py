"""A tiny run of bench/fleet_scale.py, so the fleet bench does not rot: 4 simulated hosts x 4 QPs on a lab's
3-member etcd, every phase, every figure in its JSON (not its goals: a loaded machine may miss them)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.lab, pytest.mark.timeout(120)]

BENCH = Path(__file__).parents[2] / "bench" / "fleet_scale.py"
SHAPE = ["--hosts", "4", "--qps-per-host", "4", "--mrs-per-host", "2", "--procs", "2", "--lease-ttl", "2"]
QUICK = ["--quiet", "0.5", "--down-for", "0.5", "--kill-after", "0.2", "--probe-rate", "50"]


def test_a_tiny_fleet_runs_every_phase(tmp_path: Path) -> None:
    out, png = tmp_path / "fleet.json", tmp_path / "fleet.png"
    result = subprocess.run(
        [sys.executable, str(BENCH), *SHAPE, *QUICK, "--json", str(out), "--png", str(png)],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    r = json.loads(out.read_text())
    assert png.stat().st_size > 10_000

    js = r["job_start"]
    assert (js["mappings"], js["qp_mappings"], js["mappings_in_etcd"]) == (24, 16, 24)
    assert 0 < js["publish_seconds"] < 10 and js["unsynced_hosts"] == 0
    assert js["connect_lookups"]["n"] == 16 and js["connect_not_found"] == 0
    assert js["etcd"]["puts"] >= 24 and js["etcd"]["txns"] >= 4 and js["etcd"]["ops_per_txn"] > 1
    assert js["fleet_cpu_seconds"] > 0

    for name in ("probe_lookups", "probe_lookups_found", "probe_etcd_reads"):
        assert set(r[name]) == {"burst", "quiet", "storm", "member_down", "turnover"}
        assert r[name]["quiet"]["n"] > 0 and not math.isnan(r[name]["quiet"]["p99"])
    assert r["probe_lookups"]["member_down"]["n"] > 0

    st = r["storm"]
    assert (
        st["lookups"]["n"] == 4 * 2 * 2 and st["not_found"] == 0
    )  # 2 QPs on rail 0, a QP and an MR key each
    assert st["nic_states_written_seconds"] > 0

    la = r["lapse"]
    assert la["watchers"] > 0 and la["watchers_saw_it"] == la["watchers"]
    assert 0 < la["all_seen_seconds"] < la["lease_ttl"] + 3

    ml = r["member_loss"]
    assert (ml["missing"], ml["wrong"], ml["stale"], ml["leases_changed"]) == (0, 0, 0, 0)
    assert ml["clients_running"] == ml["clients"] == 3 and ml["keys_wanted"] == 3 * (6 + 1 + 2)
    assert ml["down_seconds"] > 0

    mem = r["memory"]
    assert all(b > 0 for b in mem["etcd_db_bytes"]) and all(b > 0 for b in mem["etcd_rss_bytes"])
    assert mem["client_kib_per_host"] > 0 and mem["mappings_held_per_host"] > 0
    assert {g["figure"] for g in r["goals"]} >= {
        "job start: every mapping readable",
        "member loss: mappings lost, leases lapsed",
    }
    for row in ("job start: all mappings readable", "lease lapse: watchers saw it", "etcd RSS per member"):
        assert row in result.stdout
