"""The RDMA sysfs monitor on a fixture tree that the test changes under it."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from shiftd.inventory import port_sent
from shiftd.monitors.rdma_sysfs import MISSED_FLAP, RdmaSysfsMonitor
from shiftd.nic import PortStatus

FIXTURES = Path(__file__).parents[1] / "fixtures"


def copy_tree(tmp_path: Path, name: str) -> Path:
    """A writable copy of a fixture tree, symlinks kept relative as in sysfs."""
    root = tmp_path / name
    shutil.copytree(FIXTURES / name, root, symlinks=True)
    return root


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    return copy_tree(tmp_path, "sysfs")


def set_port(root: Path, device: str, state: str, phys: str, downed: int | None = None) -> None:
    port = root / "class" / "infiniband" / device / "ports" / "1"
    (port / "state").write_text(f"{state}\n")
    (port / "phys_state").write_text(f"{phys}\n")
    if downed is not None:
        (port / "counters" / "link_downed").write_text(f"{downed}\n")


def test_poll_reports_everything_first_then_only_changes(sysfs: Path) -> None:
    seen: list[PortStatus] = []
    monitor = RdmaSysfsMonitor(sysfs, [("mlx5_0", 1), ("mlx5_1", 1)], 0.5, seen.append)
    assert monitor.poll() == [
        PortStatus("mlx5_0", 1, "ACTIVE", "LinkUp", 0),
        PortStatus("mlx5_1", 1, "DOWN", "Disabled", 3),
    ]
    assert monitor.poll() == []
    set_port(sysfs, "mlx5_1", "4: ACTIVE", "5: LinkUp")
    assert monitor.poll() == [PortStatus("mlx5_1", 1, "ACTIVE", "LinkUp", 3)]
    assert len(seen) == 3


def test_flap_between_polls_is_reported_as_down_then_up(sysfs: Path) -> None:
    """Only link_downed saw it: the monitor reports the DOWN it missed, then the state now."""
    seen: list[PortStatus] = []
    monitor = RdmaSysfsMonitor(sysfs, [("mlx5_0", 1)], 0.5, seen.append)
    monitor.poll()
    (sysfs / "class/infiniband/mlx5_0/ports/1/counters/link_downed").write_text("7\n")
    expected = [
        PortStatus("mlx5_0", 1, "DOWN", MISSED_FLAP, 7),
        PortStatus("mlx5_0", 1, "ACTIVE", "LinkUp", 7),
    ]
    assert monitor.poll() == expected
    assert seen[1:] == expected
    assert monitor.poll() == []


def test_counter_rising_while_down_is_no_extra_flap(sysfs: Path) -> None:
    monitor = RdmaSysfsMonitor(sysfs, [("mlx5_0", 1)], 0.5, lambda s: None)
    monitor.poll()
    set_port(sysfs, "mlx5_0", "1: DOWN", "2: Polling", downed=1)
    assert monitor.poll() == [PortStatus("mlx5_0", 1, "DOWN", "Polling", 1)]
    set_port(sysfs, "mlx5_0", "4: ACTIVE", "5: LinkUp", downed=2)  # it bounced again while down
    assert monitor.poll() == [PortStatus("mlx5_0", 1, "ACTIVE", "LinkUp", 2)]


@pytest.mark.parametrize(
    ("tree", "device"), [("sysfs-roce", "mlx5_1"), ("sysfs-ib", "mlx5_0"), ("sysfs-bond", "mlx5_bond_0")]
)
def test_port_going_down_on_connectx_layouts(tmp_path: Path, tree: str, device: str) -> None:
    root = copy_tree(tmp_path, tree)
    monitor = RdmaSysfsMonitor(root, [(device, 1)], 0.5, lambda s: None)
    (first,) = monitor.poll()
    assert first.state == "ACTIVE" and first.phys_state == "LinkUp"
    set_port(root, device, "1: DOWN", "3: Disabled", downed=first.link_downed + 1)
    assert monitor.poll() == [PortStatus(device, 1, "DOWN", "Disabled", first.link_downed + 1)]


def test_removed_device_reads_as_port_down(sysfs: Path) -> None:
    monitor = RdmaSysfsMonitor(sysfs, [("mlx5_0", 1)], 0.5, lambda s: None)
    monitor.poll()
    (sysfs / "class" / "infiniband" / "mlx5_0").unlink()
    assert monitor.poll() == [PortStatus("mlx5_0", 1, "DOWN", "", 0)]


def test_run_reports_down_and_back_active_on_its_own(sysfs: Path) -> None:
    asyncio.run(_run_down_and_back(sysfs))


async def arrives(seen: asyncio.Queue[PortStatus], expected: PortStatus) -> None:
    """Wait for `expected`; a poll may land between the test's writes of two files and report
    a mix first, which is a real (if brief) state of the files."""
    async with asyncio.timeout(2):
        while await seen.get() != expected:
            pass


async def _run_down_and_back(sysfs: Path) -> None:
    seen: asyncio.Queue[PortStatus] = asyncio.Queue()
    monitor = RdmaSysfsMonitor(sysfs, [("mlx5_0", 1)], 0.02, seen.put_nowait)
    task = asyncio.create_task(monitor.run())
    try:
        assert (await asyncio.wait_for(seen.get(), 2)).state == "ACTIVE"
        set_port(sysfs, "mlx5_0", "1: DOWN", "2: Polling", downed=1)
        await arrives(seen, PortStatus("mlx5_0", 1, "DOWN", "Polling", 1))
        set_port(sysfs, "mlx5_0", "4: ACTIVE", "5: LinkUp")
        await arrives(seen, PortStatus("mlx5_0", 1, "ACTIVE", "LinkUp", 1))
        await asyncio.sleep(0.1)
        assert seen.empty()  # nothing changed, nothing reported
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def test_with_async_events_on_devices_rdma_core_does_not_list_it_polls_as_before(sysfs: Path) -> None:
    """The fixture's devices are no device of rdma-core here (no RDMA on this kernel, or not these
    names): nothing is opened, the poll carries on, and cancelling leaves nothing open."""
    asyncio.run(_run_with_events(sysfs))


async def _run_with_events(sysfs: Path) -> None:
    seen: asyncio.Queue[PortStatus] = asyncio.Queue()
    monitor = RdmaSysfsMonitor(sysfs, [("mlx5_0", 1)], 0.02, seen.put_nowait, async_events=True)
    task = asyncio.create_task(monitor.run())
    try:
        assert (await asyncio.wait_for(seen.get(), 2)).state == "ACTIVE"
        async with asyncio.timeout(30):  # rdma-core lists its devices (importing pyverbs first)
            while monitor.events is None:
                await asyncio.sleep(0.01)
        assert monitor.events.contexts == {}
        set_port(sysfs, "mlx5_0", "1: DOWN", "2: Polling", downed=1)
        await arrives(seen, PortStatus("mlx5_0", 1, "DOWN", "Polling", 1))
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert monitor.events is None


def set_counters(root: Path, device: str, counters: dict[str, int]) -> None:
    """Write an RDMA port's counters: hw_counters' by name, and the PMA counter port_xmit_packets."""
    port = root / "class" / "infiniband" / device / "ports" / "1"
    for name, value in counters.items():
        folder = port / ("counters" if name == "port_xmit_packets" else "hw_counters")
        folder.mkdir(exist_ok=True)
        (folder / name).write_text(f"{value}\n")


def test_each_poll_hands_on_what_each_port_sent_and_resent_since_the_last(sysfs: Path) -> None:
    """mlx5's counters: its sequence-error NAKs and ack timeouts (each a resend) against the packets out;
    the first read is a baseline, a port without such counters says nothing, a counter gone back (the
    driver reloaded) starts again."""
    sent: list[tuple[str, int, int, int]] = []
    monitor = RdmaSysfsMonitor(
        sysfs, [("mlx5_0", 1), ("mlx5_1", 1)], 0.1, lambda status: None, on_sent=lambda *a: sent.append(a)
    )
    set_counters(
        sysfs, "mlx5_0", {"port_xmit_packets": 1000, "packet_seq_err": 5, "local_ack_timeout_err": 1}
    )
    monitor.poll()
    assert sent == []  # a baseline only
    set_counters(
        sysfs, "mlx5_0", {"port_xmit_packets": 3000, "packet_seq_err": 45, "local_ack_timeout_err": 3}
    )
    monitor.poll()
    assert sent == [("mlx5_0", 1, 2000, 42)]  # mlx5_1 has no such counters: nothing of it
    set_counters(sysfs, "mlx5_0", {"port_xmit_packets": 10, "packet_seq_err": 0, "local_ack_timeout_err": 0})
    monitor.poll()
    set_counters(sysfs, "mlx5_0", {"port_xmit_packets": 110, "packet_seq_err": 0, "local_ack_timeout_err": 0})
    monitor.poll()
    assert sent[1:] == [("mlx5_0", 1, 100, 0)]


def test_rxe_counts_its_requesters_retries_against_its_sent_packets(sysfs: Path) -> None:
    set_counters(sysfs, "mlx5_0", {"sent_pkts": 500, "completer_retry_err": 7, "rcvd_pkts": 9})
    assert port_sent(sysfs, "mlx5_0", 1) == (500, 7)
    assert port_sent(sysfs, "mlx5_1", 1) is None  # no counters
    assert port_sent(sysfs, "mlx5_9", 1) is None  # no device
