"""Gray faults and flap damping on the lab: real namespaces, veth links through the rail's switch, tc in h0.

`shiftctl fail-nic mlx5_0 --mode lossy|slow` on h0 must really degrade h0's rail-0 link, measured between
h0 and h1 against the same link unfaulted (the share of a UDP burst that arrives, each way; one TCP
stream's rate), leave the NIC DEGRADED, and `recover-nic` must give the link back whole. A link that
bounces several times must stay DOWN longer than one that bounced once, its penalty shown by /metrics and
`shiftctl nics` (the lab's damping: the defaults' thresholds, a 1 s half-life). Lab names start with "gl".
"""

from __future__ import annotations

import subprocess
import time
import urllib.request
from collections.abc import Iterator

import grpc
import pytest
from labs import running_lab
from linkprobe import tcp_rate, udp_delivery
from waiting import wait_until

from libshift.api.shift.v1 import admin_pb2, admin_pb2_grpc, common_pb2
from shiftlab import netns
from shiftlab.lab import METRICS_PORT, Lab

pytestmark = [pytest.mark.lab, pytest.mark.timeout(180)]

LOSS = 10.0
RATE = 100_000_000


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with running_lab("gl", hosts=2, nics=2) as lab:
        yield lab


def shiftctl(lab: Lab, host: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv, env = lab.exec_command(host, ["shiftctl", *args])
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def nic_row(lab: Lab, host: str, device: str) -> list[str]:
    """The NIC's row of `shiftctl nics`: DEVICE NETDEV PROVIDER STATE REASON LINK CARRIER FAULT PENALTY GID"""
    table = shiftctl(lab, host, "nics").stdout.splitlines()
    return next(line.split() for line in table if line.split()[0] == device)


def h0_h1(lab: Lab) -> tuple[str, str, str, str]:
    """h0's and h1's namespaces and rail-0 addresses: the path through h0's mlx5_0."""
    ns = (lab.namespace("h0"), lab.namespace("h1"))
    return ns[0], ns[1], lab.shape.rail_address(0, 0), lab.shape.rail_address(0, 1)


def delivery(lab: Lab) -> tuple[float, float]:
    """The share of a UDP burst that arrives: into h0's mlx5_0 (from h1), and out of it (to h1)."""
    h0, h1, a0, a1 = h0_h1(lab)
    return udp_delivery(h1, h0, a0), udp_delivery(h0, h1, a1)


def recovered(lab: Lab) -> None:
    assert shiftctl(lab, "h0", "recover-nic", "mlx5_0").returncode == 0
    assert wait_until(lambda: nic_row(lab, "h0", "mlx5_0")[3] == "UP", timeout=10)


def test_lossy_loses_its_share_both_ways_until_recovered(lab: Lab) -> None:
    assert min(delivery(lab)) >= 0.995
    try:
        result = shiftctl(lab, "h0", "fail-nic", "mlx5_0", "--mode", "lossy", "--loss", f"{LOSS:g}%")
        assert result.returncode == 0, result.stderr
        assert "lossy 10% injected; state DEGRADED (operator_lossy)" in result.stdout
        assert nic_row(lab, "h0", "mlx5_0")[3:8] == ["DEGRADED", "operator_lossy", "up", "yes", "lossy"]
        inward, outward = delivery(lab)
        print(
            f"lab lossy {LOSS:g}%: {inward:.3f} of a burst arrives into h0's mlx5_0, {outward:.3f} out of it"
        )
        expected = 1 - LOSS / 100
        assert abs(inward - expected) < 0.03 and abs(outward - expected) < 0.03, (inward, outward)
    finally:
        recovered(lab)
    assert nic_row(lab, "h0", "mlx5_0")[7] == "-"
    assert min(delivery(lab)) >= 0.995


def test_slow_limits_what_the_nic_sends_until_recovered(lab: Lab) -> None:
    h0, h1, _, a1 = h0_h1(lab)
    unfaulted = tcp_rate(h0, h1, a1)
    assert unfaulted > 5 * RATE
    try:
        result = shiftctl(lab, "h0", "fail-nic", "mlx5_0", "--mode", "slow", "--rate", "100mbit")
        assert result.returncode == 0, result.stderr
        assert "slow 100mbit injected; state DEGRADED (operator_slow)" in result.stdout
        slowed = tcp_rate(h0, h1, a1)
        print(f"lab slow 100mbit: {slowed / 1e6:.0f} Mbit/s out (unfaulted {unfaulted / 1e6:.0f})")
        assert 0.7 * RATE < slowed < 1.1 * RATE
    finally:
        recovered(lab)
    assert tcp_rate(h0, h1, a1) > 5 * RATE


def test_a_bad_rate_is_one_line_from_shiftctl_and_nothing_changes(lab: Lab) -> None:
    result = shiftctl(lab, "h0", "fail-nic", "mlx5_0", "--mode", "slow", "--rate", "100mbps")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "rate '100mbps' is not in bits per second" in result.stderr
    assert nic_row(lab, "h0", "mlx5_0")[3] == "UP"


def h0_nic(lab: Lab) -> common_pb2.Nic:
    """mlx5_0 of h0 as its shiftd has it now (ListNics: quick enough to poll)."""
    with grpc.insecure_channel(f"unix:{lab.socket('h0')}") as channel:
        nics = admin_pb2_grpc.AdminStub(channel).ListNics(admin_pb2.ListNicsRequest(), timeout=5).nics
    return next(nic for nic in nics if nic.device == "mlx5_0")


def penalty_metric(lab: Lab) -> float:
    address = f"{lab.shape.mgmt_address(0)}:{METRICS_PORT}"

    def fetch() -> str:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
            return response.read().decode()

    series = 'shift_nic_flap_penalty{device="mlx5_0",netdev="ens1f0np0"}'
    text = netns.run(lab.namespace("h0"), fetch)
    values = [line.split()[-1] for line in text.splitlines() if line.startswith(series + " ")]
    assert values, f"no {series} in h0's /metrics"
    return float(values[0])


def bounce(lab: Lab, times: int) -> float:
    """The rail-0 switch's port to h0 goes down and up `times` times, 0.2 s a bounce (no operator fault:
    only h0's netlink monitor sees it); returns the wall clock when it was back the last time."""
    port = ["ip", "-n", lab.shape.rail_ns(0), "link", "set", "h0"]
    for _ in range(times):
        subprocess.run([*port, "down"], check=True)
        time.sleep(0.1)
        subprocess.run([*port, "up"], check=True)
        back = time.time()
        time.sleep(0.1)
    return back


def held_down(lab: Lab, back: float) -> float:
    """Seconds from the link's return until shiftd said UP (the transition's own time, not the poll's)."""
    assert wait_until(lambda: h0_nic(lab).state == common_pb2.NIC_STATE_UP, timeout=15)
    return h0_nic(lab).last_change_unix_nanos / 1e9 - back


def test_a_link_that_bounces_several_times_stays_down_longer_than_one_that_bounced_once(lab: Lab) -> None:
    assert wait_until(lambda: h0_nic(lab).flap_penalty < 50, timeout=15)  # nothing left of earlier tests
    once = held_down(lab, bounce(lab, 1))
    assert 0.9 < once < 2.0  # the lab's hold-down, 1 s: a penalty of 1000 suppresses nothing

    assert wait_until(lambda: h0_nic(lab).flap_penalty < 50, timeout=15)
    back = bounce(lab, 6)
    before = h0_nic(lab)
    assert (before.state, before.reason) == (common_pb2.NIC_STATE_DOWN, "flap_damped")
    assert before.flap_penalty > 2000  # above the suppress threshold
    # shiftctl and /metrics take their time (a busy machine: seconds), and the penalty decays meanwhile:
    # each shows a value between the daemon's own readings just before and just after
    row = nic_row(lab, "h0", "mlx5_0")
    metric = penalty_metric(lab)
    after = h0_nic(lab)
    assert before.flap_penalty + 0.5 >= float(row[8]) >= after.flap_penalty - 0.5  # shown rounded
    assert before.flap_penalty >= metric >= after.flap_penalty > 0
    if after.reason == "flap_damped":  # still suppressed after shiftctl ran: so it was while it ran
        assert row[3:5] == ["DOWN", "flap_damped"]
    several = held_down(lab, back)
    print(f"lab damping: DOWN {once:.2f} s after one bounce, {several:.2f} s after six")
    assert several > once + 0.8
    assert several < 8.0  # the lab's max_suppress_seconds bounds it
    assert h0_nic(lab).flap_penalty <= 750 * 1.05  # released at the reuse threshold (decayed since)
