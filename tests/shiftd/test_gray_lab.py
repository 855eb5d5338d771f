"""Gray faults through shiftctl on the lab: real namespaces, veth links through the rail's switch, tc in h0.

`shiftctl fail-nic mlx5_0 --mode lossy|slow` on h0 must really degrade h0's rail-0 link, measured between
h0 and h1 against the same link unfaulted (the share of a UDP burst that arrives, each way; one TCP
stream's rate), leave the NIC DEGRADED, and `recover-nic` must give the link back whole. Lab names start
with "gl".
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
from labs import running_lab
from linkprobe import tcp_rate, udp_delivery
from waiting import wait_until

from shiftlab.lab import Lab

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
    """The NIC's row of `shiftctl nics`: DEVICE NETDEV PROVIDER STATE REASON LINK CARRIER FAULT ..."""
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
