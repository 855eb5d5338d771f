"""Failover on Soft-RoCE, in `make test-rxe`'s VM: the failover suite's core cases over rxe devices.

The VM is one kernel holding both "hosts'" NICs (shiftlab/rxe/network.py): rxe0-rxe1 and rxe2-rxe3 are the
two links, the even devices h0's, the odd ones h1's. The streams are the lab's (stream_harness.py, peer.py:
the sender on rxe0 with backup rxe2, the receiver on rxe1 with backup rxe3); the faults are the VM's own.
`ip link set veth0 down` takes rxe0's link down and with it rxe1's carrier, so both sides' default paths
fail at once, and `up` brings them back (the failback); veth1 down is the peer's NIC failing; a tc
blackhole on veth0 fails the link silently, links up, so only the ack deadline finds it.

One etcd and one shiftd inside the VM for the module serve both sides (the shift layer exchanges backup
endpoints through them). shiftd watches the four rxe devices as RDMA devices: its inventory from
/sys/class/infiniband, their port state from sysfs, read when their async events (PORT_ERR, PORT_ACTIVE)
say it moved; its poll of the ports is set to an hour, so that only the events can explain a port state
seen moving within a test. The policy's "the next NICs of the host" cannot tell
the hosts apart on one kernel (rxe0's next NIC is its own peer), so SHIFT_BACKUP_DEVICES names the backups.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from daemon_harness import DaemonProcess
from stream_harness import BOTH, PATH_LOST, Bed, Fault, admin, assert_intact, run_stream

from libshift.api.shift.v1 import admin_pb2, common_pb2
from libshift.verbs import get_device_list
from shiftd.inventory import port_sent, port_status
from shiftlab.etcdproc import EtcdProcess
from shiftlab.rxe.network import ENDS, SYSFS_IB

pytestmark = [pytest.mark.lab, pytest.mark.soft_roce, pytest.mark.timeout(600)]

NICS = {"h0": ("rxe0", "rxe2"), "h1": ("rxe1", "rxe3")}  # each host's default, then its backup
BACKUPS = ",".join(f"{default}={backup}" for default, backup in NICS.values())
PATIENCE = 6.0  # TCG runs the peers about that many times slower than the lab's hosts
# small streams (the point is correctness), and peers that leave the VM's two CPUs to shiftd when idle. Under
# emulation, beside CI's host suite, the VM stalls for a second now and then: the peers' ack deadline is
# 4.3 s (timeout 18, on every path) and the default path's detection 1.07 s (SHIFT_DETECT_TIMEOUT 16, unless
# a test sets its own), so that a stall is not taken for a failure: a healthy default path once moved an
# extra time after a failback (67 ms), and a backup path once gave up (0.54 s) with nowhere left to go
PATIENT = ("--timeout", "18")
SENDER = ("--rate", "200", "--progress", "50", "--idle", "0.002", *PATIENT)
RECEIVER = ("--idle", "0.002", *PATIENT)
DETECT = {"SHIFT_DETECT_TIMEOUT": "16"}
NETDEV = {end.device: end.netdev for end in ENDS}
SYSFS = SYSFS_IB.parent.parent
# shiftd reads the ports at once on their async events; this poll would come too late for any wait here,
# so a port state these tests see moving came from an event
EVENTS_ONLY = {"rdma_poll_seconds": 3600.0}


class RxeBed:
    """Both hosts in this kernel, their peers aimed at the one shiftd, with the backups named."""

    patience = PATIENCE
    host_names = list(NICS)

    def __init__(self, socket: str, log: Callable[[], str]) -> None:
        self._socket = Path(socket)
        self.log = log  # shiftd's log so far

    def exec_command(self, host: str, argv: Sequence[str]) -> tuple[list[str], dict[str, str]]:
        env = {**DETECT, **os.environ, "SHIFT_SOCKET": str(self._socket), "SHIFT_BACKUP_DEVICES": BACKUPS}
        return list(argv), env

    def socket(self, host: str) -> Path:
        return self._socket

    def rdma_devices(self, host: str) -> tuple[str, ...]:
        return NICS[host]


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RxeBed]:
    """etcd and shiftd inside the VM, for every test of the module."""
    present = {d.name for d in get_device_list() if d.provider == "verbs"}
    if not {name for pair in NICS.values() for name in pair} <= present:
        pytest.skip(
            f"needs the rxe devices of make test-rxe's VM (shiftlab.rxe); verbs has {sorted(present)}"
        )
    tmp = tmp_path_factory.mktemp("rxe")
    etcd = EtcdProcess(data_dir=tmp / "etcd", log_path=tmp / "etcd.log")
    etcd_patience = {"endpoints": [etcd.endpoint], "timeout_seconds": 2 * PATIENCE}  # etcd under TCG
    sections = {"etcd": etcd_patience, "monitors": EVENTS_ONLY}
    daemon = DaemonProcess(tmp / "shiftd", sections=sections)
    try:
        etcd.start(wait=120)  # under TCG a start takes seconds
        daemon.start(timeout=120)
        yield RxeBed(daemon.socket, daemon.log)
    finally:
        daemon.stop()
        etcd.kill()
        print(daemon.log()[-6000:])  # shown by pytest when a test failed


def nics(bed: Bed) -> dict[str, common_pb2.Nic]:
    with admin(bed, "h0") as stub:
        return {nic.device: nic for nic in stub.ListNics(admin_pb2.ListNicsRequest(), timeout=30).nics}


def nic_states(bed: Bed, device: str, since: float) -> list[str]:
    """The states shiftd's NIC events gave `device` after `since`, in order."""
    request = admin_pb2.StreamEventsRequest(backlog=1000, follow=False)
    with admin(bed, "h0") as stub:
        events = [e.nic for e in stub.StreamEvents(request, timeout=30) if e.HasField("nic")]
    return [
        common_pb2.NicState.Name(e.state)
        for e in events
        if e.device == device and e.time_unix_nanos > since * 1e9
    ]


def wait_ports(bed: Bed, devices: Sequence[str], state: str) -> None:
    """Until shiftd says each of `devices` has its rxe port in `state` (DOWN, ACTIVE), read from sysfs, and
    the NIC in the state that follows (DOWN, or UP once its hold-down is over): a recovery is over only
    then, else its UP lands in the next test's events."""
    deadline = time.monotonic() + 10 * PATIENCE
    nic_state = "NIC_STATE_UP" if state == "ACTIVE" else "NIC_STATE_DOWN"
    wanted = dict.fromkeys(devices, (state, nic_state))
    while (seen := {d: port_and_state(nics(bed)[d]) for d in devices}) != wanted:
        if time.monotonic() > deadline:  # which side is behind: the kernel's ports, or shiftd's view of them
            kernel = {d: port_status(SYSFS, d, 1) for d in devices}
            tail = bed.log()[-4000:]
            pytest.fail(f"shiftd's ports and NICs: {seen}, not {wanted}; sysfs: {kernel}\n{tail}")
        time.sleep(0.2)


def port_and_state(nic: common_pb2.Nic) -> tuple[str, str]:
    return nic.port_state, common_pb2.NicState.Name(nic.state)


def link(device: str) -> Fault:
    """`ip link set NETDEV down` under `device`, then up: the veth's peer loses its carrier too, so both
    hosts' default devices go down, and shiftd must see both ports go DOWN and come back ACTIVE."""
    pair = [NICS["h0"][0], NICS["h1"][0]]

    def set_link(bed: Bed, how: str, port: str) -> None:
        subprocess.run(["ip", "link", "set", NETDEV[device], how], check=True)
        wait_ports(bed, pair, port)

    return Fault(
        BOTH,
        "nic_event",
        lambda bed: set_link(bed, "down", "DOWN"),
        lambda bed: set_link(bed, "up", "ACTIVE"),
    )


def blackhole() -> Fault:
    """tc drops all that h0's default device sends, links up: no shiftd sees it, h0's sends time out."""
    dev = ["dev", NETDEV[NICS["h0"][0]], "root"]
    return Fault(
        "h0",
        "error_completion",
        lambda _: subprocess.run(["tc", "qdisc", "replace", *dev, "blackhole"], check=True),
        lambda _: subprocess.run(["tc", "qdisc", "del", *dev], check=True),
    )


def stream(bed: RxeBed, mode: str, fault: Fault, **options: object) -> tuple[dict, dict]:
    """run_stream with this module's small, idle-friendly peers."""
    return run_stream(bed, mode, fault, sender_args=SENDER, receiver_args=RECEIVER, **options)


def test_shiftd_watches_the_rxe_devices_it_found_in_sysfs(bed: RxeBed) -> None:
    found = nics(bed)
    assert sorted(found) == sorted(path.name for path in SYSFS_IB.iterdir()), found.keys()  # no tcp device
    for device, nic in found.items():
        seen = (nic.provider, nic.netdev, nic.port_state, common_pb2.NicState.Name(nic.state))
        assert seen == ("verbs", NETDEV[device], "ACTIVE", "NIC_STATE_UP"), device
    watching, deadline = f"watching the async events of {', '.join(sorted(found))}", time.monotonic() + 60
    while watching not in bed.log():  # shiftd opens the devices after its first poll of their ports
        assert time.monotonic() < deadline, "shiftd did not open the devices for their async events"
        time.sleep(0.5)


@pytest.mark.parametrize("mode", ["send", "write_imm", "write_read"])
def test_a_stream_fails_over_when_the_link_goes_down_and_back_when_it_is_up(bed: RxeBed, mode: str) -> None:
    """Down, up (back on the default devices, the backups re-armed), down again: the lab's failback case
    (test_failover.py), with the port states and NIC events shiftd had from the kernel."""
    since = time.time()
    sent, received = stream(bed, mode, link("rxe0"), failbacks=1)
    if mode == "write_read":
        assert sent["errors"] == [] and sent["failed"] == [], sent
        assert sent["verified"] == sent["completed"] > 0  # every READ brought back what its WRITE put there
    else:
        assert_intact(sent, received)
    for device in (NICS["h0"][0], NICS["h1"][0]):
        assert nic_states(bed, device, since)[:3] == ["NIC_STATE_DOWN", "NIC_STATE_UP", "NIC_STATE_DOWN"]


def test_the_peers_nic_failing_moves_both_sides(bed: RxeBed) -> None:
    """veth1 down: the receiver's link, rxe0's carrier with it. rxe0's own counts of what it sent rose
    meanwhile, as the loss judge reads them (inventory.port_sent: its evidence on an RNIC)."""
    before = port_sent(SYSFS, "rxe0", 1)
    assert_intact(*stream(bed, "send", link("rxe1")))
    after = port_sent(SYSFS, "rxe0", 1)
    assert before is not None and after is not None and after[0] > before[0] and after[1] >= before[1]


def test_an_atomic_in_flight_when_the_link_fails_is_failed_closed(
    bed: RxeBed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A FETCH_AND_ADD lost in the black hole: its error reaches the application, it is never replayed,
    and the SENDs around it are delivered as usual. The default path's ack deadline is 1.07 s here, not
    67 ms: under emulation the sender once met it, and switched, before it read the order to post the
    atomic (on CI)."""
    monkeypatch.setenv("SHIFT_DETECT_TIMEOUT", "16")  # the peers inherit the test's environment
    sent, received = stream(bed, "send", blackhole(), then={"atomic": True})
    assert sent["atomic"] in PATH_LOST, sent
    assert received["counter"] == 0  # not executed by the black hole, not executed by a replay
    assert_intact(sent, received)
