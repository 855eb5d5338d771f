"""The lab side of the failover tests: a stream between peer.py on two lab hosts, real faults, and what
each shiftd was told.

A `Stream` runs the sender on h0 and the receiver on h1 (endpoints exchanged through this process as JSON
lines) and ends with both peers' final reports; `run_stream` is the common script (fault in the middle of
the stream, optional failbacks, every check). Faults are real: shiftd's admin service on a lab host
applies them (the calls `shiftctl fail-nic` makes) or tc on a rail switch (no shiftd sees it).

The stream and its checks also run on a bed other than the lab (`OwnBed`: test_rxe.py's Soft-RoCE
devices in one VM, one shiftd for both hosts, its own faults).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from libshift.api.shift.v1 import admin_pb2, admin_pb2_grpc, common_pb2
from libshift.core import wire
from shiftd.ctl import MODES, Client
from shiftlab.lab import Lab
from shiftlab.labproc import LabProcess

PEER = str(Path(__file__).with_name("peer.py"))
HOSTS = ("h0", "h1")
BOTH = "both"
# property tests on the lab: each example is a real stream of seconds, so a few, the written-out ones first,
# none stored between runs and no shrinking (a failing draw is printed as it was)
FEW_REAL_EXAMPLES = settings(
    max_examples=3,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow],
)
PATH_LOST = ("IBV_WC_RETRY_EXC_ERR", "IBV_WC_WR_FLUSH_ERR")  # what a path with nowhere to go gives


class OwnBed(Protocol):
    """Somewhere other than the lab for the stream: what the harness asks of it beyond what a Lab has."""

    patience: float  # how many times the lab's timeouts it needs (a VM under emulation is slow)

    @property
    def host_names(self) -> list[str]: ...

    def exec_command(self, host: str, argv: Sequence[str]) -> tuple[list[str], dict[str, str]]: ...

    def socket(self, host: str) -> Path:
        """The socket of the shiftd `host`'s peer registers with."""
        ...

    def rdma_devices(self, host: str) -> tuple[str, ...]:
        """`host`'s devices, the default first."""
        ...


Bed = Lab | OwnBed


def rdma_devices(bed: Bed, host: str) -> tuple[str, ...]:
    """`host`'s RDMA devices, the default first: on the lab, every host's are mlx5_0, mlx5_1, ..."""
    if isinstance(bed, Lab):
        return tuple(bed.shape.rdma_device(rail) for rail in range(bed.shape.nics))
    return bed.rdma_devices(host)


def patience(bed: Bed) -> float:
    """How many times the lab's timeouts a bed needs."""
    return 1.0 if isinstance(bed, Lab) else bed.patience


@dataclass(frozen=True)
class Step:
    """One fault of a drawn plan."""

    host: str
    mode: str  # shiftctl fail-nic --mode (flap: every 0.4 s until recovered)
    recover: str  # "next": before the next step; "end": after the last step, in order; "never"
    device: str = "mlx5_0"


def fault_steps(devices: tuple[str, ...] = ("mlx5_0",)) -> st.SearchStrategy[Step]:
    """Steps on either host, failing one of `devices` in any mode, recovered at any time or never."""
    return st.builds(
        Step,
        host=st.sampled_from(HOSTS),
        mode=st.sampled_from(["down", "blackhole", "flap"]),
        recover=st.sampled_from(["next", "end", "never"]),
        device=st.sampled_from(devices),
    )


class Peer(LabProcess):
    """peer.py on a lab host (or a bed's), spoken to in JSON lines, on the host's default device."""

    def __init__(self, bed: Bed, host: str, *args: str) -> None:
        argv = [sys.executable, PEER, *args, "--device", rdma_devices(bed, host)[0]]
        super().__init__(bed, host, [*argv, "--patience", str(patience(bed))], timeout=40.0 * patience(bed))


# -- shiftd ------------------------------------------------------------------------------------------------


@contextmanager
def admin(bed: Bed, host: str) -> Iterator[admin_pb2_grpc.AdminStub]:
    """shiftd's admin service on `host`, over its socket: what shiftctl calls, without a process per call
    (a second of CPU each on a busy machine: too slow to land a fault inside a handshake)."""
    client = Client(str(bed.socket(host)), timeout=30.0)
    try:
        yield client.admin
    finally:
        client.close()


def failover_reports(bed: Bed, host: str, since: float, wait_for: int = 0) -> list[common_pb2.FailoverReport]:
    """The FailoverReports shiftd of `host` was given after `since` (time.time()) on `host`'s devices, in
    time order; waits up to 10 s for `wait_for` of them (reports go to shiftd off the data path)."""
    deadline = time.monotonic() + 10 * patience(bed)
    request = admin_pb2.StreamEventsRequest(backlog=200, follow=False)
    mine = rdma_devices(bed, host)  # a bed's one shiftd may hear both hosts
    while True:
        with admin(bed, host) as stub:
            reports = [e.failover for e in stub.StreamEvents(request, timeout=30) if e.HasField("failover")]
        found = [r for r in reports if r.time_unix_nanos > since * 1e9 and r.device in mine]
        found.sort(key=lambda r: r.time_unix_nanos)
        if len(found) >= wait_for or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def switches(bed: Bed, host: str, since: float, wait_for: int = 0) -> list[tuple[str, str, str, str]]:
    """failover_reports as (kind, device left, device used, reason)."""
    return [
        (common_pb2.FailoverKind.Name(r.kind), r.device, r.backup_device, r.reason)
        for r in failover_reports(bed, host, since, wait_for)
    ]


def wait_nic_state(bed: Bed, host: str, device: str, state: str, timeout: float = 10.0) -> None:
    """Until shiftd of `host` says `device` is in `state` ("NIC_STATE_UP", ...)."""
    deadline = time.monotonic() + timeout * patience(bed)
    while True:
        with admin(bed, host) as stub:
            nics = stub.ListNics(admin_pb2.ListNicsRequest(), timeout=30).nics
        now = common_pb2.NicState.Name(next(n.state for n in nics if n.device == device))
        if now == state:
            return
        assert time.monotonic() < deadline, f"{host} {device}: {now}, not {state}"
        time.sleep(0.1)


def wait_all_up(bed: Bed) -> None:
    """Until every shiftd of the lab says every NIC is UP, past the hold-down of the last recovery.

    A recovered NIC stays DOWN for the hold-down (1 s in the lab) after its link is back. A stream that
    starts inside it runs on a NIC its shiftd already calls DOWN; a fault injected then changes no state,
    so no NIC event goes out and the fault is found late (at the ack deadline) or never (under a flap)."""
    for host in bed.host_names:
        for device in rdma_devices(bed, host):
            wait_nic_state(bed, host, device, "NIC_STATE_UP")


# -- faults ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """A real fault, and how the side that meets it first (`host`, or BOTH) should notice it."""

    host: str
    reason: str
    inject: Callable[[Bed], None]
    recover: Callable[[Bed], None]


def fail_nic(lab: Lab, hosts: Sequence[str], device: str, mode: str = "down", period: float = 0.0) -> float:
    """`shiftctl fail-nic DEVICE --mode MODE [--period P]` on each of `hosts`, one right after the other;
    when the first was asked (time.time(), taken once its connection is up, so a clock started there counts
    shiftd's work, not the channel's)."""
    request = admin_pb2.FailNicRequest(device=device, mode=MODES[mode], flap_period_seconds=period)
    asked = []
    for host in hosts:
        with admin(lab, host) as stub:
            stub.Status(admin_pb2.StatusRequest(), timeout=30)
            asked.append(time.time())
            stub.FailNic(request, timeout=30)
    return asked[0]


def recover_nic(lab: Lab, hosts: Sequence[str], devices: Sequence[str]) -> None:
    """`shiftctl recover-nic DEVICE` for each of `devices` on each of `hosts` (a no-op on a healthy NIC)."""
    for host in hosts:
        with admin(lab, host) as stub:
            for device in devices:
                stub.RecoverNic(admin_pb2.RecoverNicRequest(device=device), timeout=30)


def recover_everything(lab: Lab) -> None:
    recover_nic(lab, lab.host_names, [lab.shape.rdma_device(r) for r in range(lab.shape.nics)])


def nic_fault(host: str, mode: str = "down", device: str = "mlx5_0", period: float = 0.0) -> Fault:
    """`fail-nic DEVICE --mode MODE` on `host` (or on both hosts at once): shiftd holds the NIC DOWN for
    any mode and says so first, so the NIC event is the detection."""
    hosts = HOSTS if host == BOTH else (host,)
    return Fault(
        host,
        "nic_event",
        lambda lab: fail_nic(lab, hosts, device, mode, period),
        lambda lab: recover_nic(lab, hosts, [device]),
    )


def rail_qdisc(lab: Lab, rail: int, towards: str, *qdisc: str) -> None:
    """Set the root qdisc of rail `rail`'s switch port towards a host (none: remove it)."""
    dev = ["dev", towards, "root"]
    args = ["replace", *dev, *qdisc] if qdisc else ["del", *dev]
    subprocess.run(["tc", "-n", lab.shape.rail_ns(rail), "qdisc", *args], check=True)


@contextmanager
def frames_held(lab: Lab, rail: int, towards: str, op: wire.Op) -> Iterator[None]:
    """Rail `rail`'s switch drops every TCP segment towards a host that opens with a tcp-provider frame of
    kind `op`, until the block ends: that message is held (TCP retransmits it, in vain, and what follows it
    on its connection waits behind it) while all else flows. The match assumes what the lab's links carry:
    a 20-byte IPv4 header and a 32-byte TCP header (timestamps on), both checked by the filter."""
    tc = ["tc", "-n", lab.shape.rail_ns(rail)]
    dev = ["dev", towards]
    commands = [
        ["qdisc", "replace", *dev, "root", "handle", "1:", "htb", "default", "1"],
        ["class", "add", *dev, "parent", "1:", "classid", "1:1", "htb", "rate", "10gbit", "quantum", "1514"],
        ["class", "add", *dev, "parent", "1:", "classid", "1:2", "htb", "rate", "10gbit", "quantum", "1514"],
        ["qdisc", "add", *dev, "parent", "1:2", "blackhole"],
        ["filter", "add", *dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
         "match", "u8", "0x45", "0xff", "at", "0",  # IPv4, no options
         "match", "u8", "6", "0xff", "at", "9",  # TCP
         "match", "u8", "0x80", "0xf0", "at", "32",  # a 32-byte TCP header
         "match", "u16", f"{wire.MAGIC << 8 | op:#06x}", "0xffff", "at", "52",
         "flowid", "1:2"],
    ]  # fmt: skip
    try:
        for command in commands:
            subprocess.run([*tc, *command], check=True)
        yield
    finally:
        rail_qdisc(lab, rail, towards)


def silent_blackhole(towards: str = "h1") -> Fault:
    """Rail 0's switch drops everything towards one host, links stay up: no shiftd sees it, h0's sends
    time out. Towards h1 the messages are lost; towards h0 only their acks are (h1 has them all)."""
    return Fault(
        "h0",
        "error_completion",
        lambda lab: rail_qdisc(lab, 0, towards, "blackhole"),
        lambda lab: rail_qdisc(lab, 0, towards),
    )


FROZEN = 0.5  # seconds h0's shiftd is held stopped while its NIC fails


def link_lost_while_shiftd_is_frozen(lab: Lab, reason: str) -> Fault:
    """h0's port on rail 0's switch goes down (h0's mlx5_0 loses carrier) while h0's shiftd is frozen
    (SIGSTOP) for FROZEN seconds: no NIC event can come from the daemon meanwhile, so a move for
    "nic_event" is the link watch's (libshift/shift/links.py), the application's own netlink socket; one
    for "error_completion" is the ack deadline's (67 ms on the default path). The daemon, thawed, sees the
    link down, reports the NIC DOWN, and its UP after recovery brings the stream home."""
    port = ["ip", "-n", lab.shape.rail_ns(0), "link", "set", "h0"]

    def inject(lab: Lab) -> None:
        daemon = lab.daemon("h0")  # checked against its start time: a PID of ours, alive
        assert daemon is not None
        os.kill(daemon.pid, signal.SIGSTOP)
        try:
            subprocess.run([*port, "down"], check=True)
            time.sleep(FROZEN)
        finally:
            os.kill(daemon.pid, signal.SIGCONT)

    return Fault("h0", reason, inject, lambda lab: subprocess.run([*port, "up"], check=True))


# -- the stream --------------------------------------------------------------------------------------------


class Stream:
    """The sender on h0 and the receiver on h1, connected and streaming (`with Stream(...) as s:`) once
    the sender has posted --progress messages; `finish()` stops it and returns both final reports.

    Without the `with`, `start()` starts it and `end()` ends the peers (a test whose peers start while
    their shiftd is away: healthy_first=False, as nothing can be asked of that shiftd then)."""

    def __init__(
        self,
        bed: Bed,
        mode: str,
        qps: int = 1,
        sender_args: Sequence[str] = (),
        receiver_args: Sequence[str] = (),
        healthy_first: bool = True,
    ) -> None:
        if healthy_first:
            wait_all_up(bed)  # every test's faults must find healthy NICs
        self.mode = mode
        self.patience = patience(bed)
        common = ("--mode", mode, "--qps", str(qps))
        self.sender = Peer(bed, "h0", "sender", *common, *sender_args)
        self.receiver = Peer(bed, "h1", "receiver", *common, *receiver_args)

    def __enter__(self) -> Stream:
        self.start()
        return self

    def start(self, timeout: float = 20.0) -> None:
        """Exchange the endpoints, connect, and stream until the sender has posted --progress messages."""
        sender, receiver = self.sender, self.receiver
        timeout *= self.patience
        ends = sender.read("endpoints", timeout=timeout), receiver.read("endpoints", timeout=timeout)
        sender.send(**ends[1])
        receiver.send(**ends[0])
        for peer in (sender, receiver):
            connected = peer.read("connected", timeout=timeout)
            assert connected == {"connected": True, "resilient": True, "state": "default"}, connected
        receiver.send(go=True)
        sender.send(go=True)
        sender.read("progress", timeout=20 * self.patience)

    def wait_armed(self, path: str, timeout: float = 10.0) -> None:
        """Until both peers have `path` armed on every QP (a re-arm handshake is over)."""
        for peer in (self.sender, self.receiver):
            peer.send(armed=path)
        for peer in (self.sender, self.receiver):
            assert peer.read("armed", timeout=timeout * self.patience) == {"armed": path}

    def finish(self, stop: bool = True) -> tuple[dict, dict]:
        """Stop the sender (or, stop=False, wait until it stops at an error completion), let the receiver
        take what the sender saw complete, and both reports."""
        if stop:
            self.sender.send(stop=True)
        sent = self.sender.read("done")
        self.receiver.send(stop=True, expect=0 if self.mode == "write_read" else sent["completed"])
        received = self.receiver.read("done")
        for peer in (self.sender, self.receiver):
            assert peer.end() == 0, peer.stderr()
            assert "Traceback" not in peer.stderr(), peer.stderr()  # no thread of libshift's died
        return sent, received

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        self.end(failed=kind is not None)

    def end(self, failed: bool = False) -> None:
        """End both peers (if still running); after a failure, show what they said."""
        for peer in (self.sender, self.receiver):
            peer.end(grace=0)
        if failed:  # shown by pytest with the failure
            for peer in (self.sender, self.receiver):
                print(f"--- {peer.host} stderr:\n{peer.stderr()}")


def assert_intact(sent: dict, received: dict) -> None:
    """Every message the sender saw complete arrived once, in order, with a good checksum, and no error
    completion reached either application."""
    assert sent["errors"] == [] and received["errors"] == [], (sent, received)
    assert sent["failed"] == [] and received["failed"] == [], (sent, received)
    assert sent["completed"] == received["received"], (sent, received)


def assert_clean_error(sent: dict, received: dict) -> None:
    """The sender got an error completion and every WR it posted completed (nothing hangs); no message
    was lost before an acked one, none came twice or out of order."""
    assert sent["errors"] == [] and received["errors"] == []
    assert sent["failed"], sent
    assert sent["failed"][0].endswith(PATH_LOST), sent["failed"]
    assert sent["finished"], sent
    assert sent["completed"] <= received["received"] <= sent["posted"], (sent, received)


def assert_switched(sent: dict, received: dict, mode: str, cycle: Sequence[str], qps: int = 1) -> None:
    """Both sides went through `cycle` (states of their QPs), each switch with the stream in full flow."""
    for side in (sent, received) if mode != "write_read" else (sent,):
        assert [state for state, _ in side["states"]] == list(cycle), side
        assert side["finals"] == [cycle[-1]] * qps, side  # every QP, not only the first
        assert all(0 < at < sent["completed"] for _, at in side["states"]), side


def assert_reports(bed: Bed, since: float, fault: Fault, count: int, qps: int = 1) -> None:
    """Each shiftd was told of `count` switches (failover, failback, failover, ...) per QP since `since`:
    the side that met the fault (or its recovery) noticed it itself, the other heard the peer's
    notification; when both met it, either may come first on each side. A link taken down can also
    fail a WR (its socket errs) before shiftd's NIC event arrives: detection is the fastest of the two, so
    on the side that met a NIC event an error completion is as good. So too for a failback both met: the
    side that leads it re-arms the backup it leaves, and the other, still sending there, may meet that as
    an error completion before the leader's count arrives, and go home on it (nothing is lost: the counts
    settle what the error flushed)."""
    also = {"nic_event": "error_completion"}.get(fault.reason)
    for host in HOSTS:
        mine = host == fault.host
        default, backup = rdma_devices(bed, host)[:2]
        heard = "peer_notification"
        failover = ("FAILOVER_KIND_FAILOVER", default, backup, fault.reason if mine else heard)
        failback = ("FAILOVER_KIND_FAILBACK", backup, default, "nic_recovered" if mine else heard)
        expected = [(failover, failback)[i % 2] for i in range(count) for _ in range(qps)]
        got = switches(bed, host, since, wait_for=len(expected))
        got = [(*g[:3], fault.reason) if (g[0], g[3]) == ("FAILOVER_KIND_FAILOVER", also) else g for g in got]
        if fault.host == BOTH:
            assert {g[3] for g in got} <= {fault.reason, "nic_recovered", "peer_notification"} | {also}, got
            got = [(*g[:3], e[3]) for g, e in zip(got, expected, strict=False)]
        assert got == expected, f"{host}: {got}"


def run_stream(
    bed: Bed,
    mode: str,
    fault: Fault,
    failbacks: int = 0,
    then: dict | None = None,
    qps: int = 1,
    receiver_args: tuple[str, ...] = (),
    sender_args: tuple[str, ...] = (),
) -> tuple[dict, dict]:
    """Stream h0 -> h1 and inject `fault` in the middle; the two peers' final reports.

    With failbacks=n, the fault is also recovered in the middle of the stream, n times over, each time once
    the sender is back on the default path, before the last injection. `then` is an order for the sender
    right after the last injection. With qps=n the stream goes round-robin over n QPs sharing one CQ.
    """
    injected = False
    try:
        with Stream(bed, mode, qps, sender_args, receiver_args) as stream:
            failed_at = time.time()
            for done in range(1, failbacks + 1):
                injected = True  # from here a failure must still recover it, or the next test finds it
                fault.inject(bed)
                assert stream.sender.read("state")["state"] == "fallback"
                fault.recover(bed)
                assert stream.sender.read("state", timeout=15 * stream.patience)["state"] == "default"
                for host in HOSTS:  # both sides finished the failback, so both re-armed the backup
                    switches(bed, host, failed_at, wait_for=2 * done * qps)
            fault.inject(bed)
            injected = True
            if then:
                stream.sender.send(**then)
            assert stream.sender.read("state")["state"] == "fallback"
            # traffic on the backup path, long enough for the receiver's side to see its move in the stream
            # (under emulation it saw it once, after the last message, in 0.5 s)
            time.sleep(0.5 * stream.patience)
            sent, received = stream.finish()
            # checked in the stream's block, so that a failure shows what the peers logged
            cycle = ["fallback", "default"] * failbacks + ["fallback"]
            assert_switched(sent, received, mode, cycle, qps)
            assert_reports(bed, failed_at, fault, len(cycle), qps)
        return sent, received
    finally:
        if injected:
            fault.recover(bed)
