"""The failover benchmarks run end to end in a tiny configuration, so that they do not rot.

One 2x2 lab for the module (prefix "fb"); each benchmark runs as the user runs it, with --lab naming that lab
and its JSON written to the test's directory. The checks are on what each benchmark measured, not on the
figures' targets (this machine is shared and noisy): a time is positive and bounded, every QP resumed, the
plot is a PNG, the table has its rows.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from labs import running_lab

pytestmark = [pytest.mark.lab, pytest.mark.timeout(180)]

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def lab():
    with running_lab("fb", hosts=2, nics=2) as lab:
        yield lab


def bench(lab, tmp_path: Path, script: str, *args: str) -> tuple[str, dict]:
    """Run bench/`script` on the lab; its table (stdout) and its JSON results."""
    out = tmp_path / f"{script}.json"
    result = subprocess.run(
        [sys.executable, str(BENCH / f"{script}.py"), "--lab", lab.name, "--json", str(out), *args],
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout, json.loads(out.read_text())


# The steps of a failover that each trial must show, and pairs of them that can only come in this order: a
# host's own steps in program order, and a count taken only after the peer began to switch and send it.
# "detected" is the first of the link watch's event, shiftd's and an ack deadline, whichever moved the QPs.
STEPS = ("detected", "switch", "old_path_stopped", "count_sent", "peer_count", "replay_posted")
BEFORE = [
    ("h0 detected", "h0 switch"),
    ("h0 switch", "h0 old_path_stopped"),
    ("h0 old_path_stopped", "h0 count_sent"),
    ("h0 count_sent", "h1 peer_count"),
    ("h1 peer_count", "h1 switch"),
    ("h1 count_sent", "h0 peer_count"),
    ("h0 peer_count", "h0 replay_posted"),
]


def test_failover_downtime(lab, tmp_path: Path) -> None:
    table, results = bench(
        lab, tmp_path, "failover_downtime", "--trials", "2", "--modes", "send,read", "--steps"
    )
    for mode in ("send", "read"):
        samples = results["trials"][mode]
        assert len(samples) == 2
        for s in samples:  # after the link went down, and well inside the stream's life
            assert 0 < s["downtime_ms"] < 5000, s
        assert any(line.startswith(mode) and "median < 1 ms" in line for line in table.splitlines())
        # where the downtime went: every step in every trial, inside it, in an order that can be
        steps = results["steps"][mode]
        needed = [f"h0 {name}" for name in STEPS] + ["h1 peer_count", "h1 switch", "h1 count_sent"]
        for step in needed:
            assert len(steps[step]) == 2, (step, steps)
        for trial, sample in enumerate(samples):
            assert all(0 <= steps[step][trial] <= sample["downtime_ms"] for step in needed), steps
            for first, then in BEFORE:
                assert steps[first][trial] <= steps[then][trial], (first, then, steps)
        assert f"{mode}: where the downtime goes" in table


def test_blackhole_detection(lab, tmp_path: Path) -> None:
    table, results = bench(lab, tmp_path, "blackhole_detection", "--trials", "1", "--settings", "20:7")
    (sample,) = results["20:7"]
    # never before the default path's deadline (4.096 us x 2^12 x 4 = 67 ms, not the application's 34 s):
    # no NIC saw it
    assert 67 < sample < 5000
    assert "timeout 20, retry_cnt 7 (NCCL default)" in table


def test_shift_overhead(lab, tmp_path: Path) -> None:
    args = ("--rounds", "1", "--seconds", "0.3", "--pings", "30", "--bw-size", "65536")
    table, results = bench(lab, tmp_path, "shift_overhead", *args)
    for metric in ("bandwidth", "latency"):
        for stack in ("plain", "shift"):
            (value,) = results["runs"][metric][stack]
            assert value > 0 and math.isfinite(value)
    assert "bandwidth" in table and "half round trip" in table
    assert results["peers"]["tcp_lat"] > 0 and results["peers"]["iperf3"] > 0  # qperf, iperf3 on the link
    assert "qperf tcp_lat" in table


def test_many_qp_failover(lab, tmp_path: Path) -> None:
    table, results = bench(lab, tmp_path, "many_qp_failover", "--qps", "8", "--trials", "1")
    (trial,) = results["trials"]
    assert 0 < trial["first"] <= trial["median"] <= trial["all"] < 10000, trial
    rss = results["rss_kib"]
    assert rss["shift"]["h0"] > 0 and rss["plain"]["h0"] > 0
    assert "all QPs do" in table and "per backup" in table


def test_failover_throughput(lab, tmp_path: Path) -> None:
    png = tmp_path / "throughput.png"
    args = ("--before", "0.5", "--during", "0.5", "--after", "0.3", "--png", str(png))
    table, results = bench(lab, tmp_path, "failover_throughput", *args)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    marks = results["marks_s"]
    assert marks["link down"] < marks["resumed on backup"] < marks["link up"] < marks["back on mlx5_0"]
    assert len(results["completions_s"]) > 10
    assert "throughput gap at the failure" in table


def test_gray_failure(lab, tmp_path: Path) -> None:
    """One trial of a 10% lossy port and one of a slow port, and a few seconds of healthy load: the lossy
    one moved the traffic, found by some detection, and nothing moved on the healthy lab."""
    table, results = bench(
        lab, tmp_path, "gray_failure", "--trials", "1", "--loss", "10", "--rate", "100mbit", "--quiet", "3",
        "--during", "1", "--after", "1",
    )  # fmt: skip
    (lossy,) = results["faults"]["lossy 10%"]
    assert lossy["moved_s"] is not None and 0 < lossy["moved_s"] < 5, lossy
    host, reason = lossy["found_by"].split()
    assert host in ("h0", "h1") and reason in ("nic_event", "error_completion"), lossy
    assert lossy["moves"] >= 1, lossy
    assert lossy["before"] > 0 and lossy["after"] > 0, lossy
    (slow,) = results["faults"]["slow 100mbit"]
    assert slow["during"] < 1.0, slow  # the rate limit did slow the stream
    assert results["quiet"]["false_moves"] == 0, results["quiet"]
    assert any(line.startswith("lossy 10%") for line in table.splitlines())
    assert "false moves" in table
