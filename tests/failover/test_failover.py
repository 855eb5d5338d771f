"""Failover on the lab fabric: a stream between two lab hosts survives `shiftctl fail-nic mlx5_0`.

One 2x2 lab for the module; a peer program (peer.py) per host, endpoints exchanged through this process as
JSON lines. Every test recovers the NIC it failed, so the order of the tests does not matter.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from labs import running_lab

from shiftd.lab import Lab

pytestmark = [pytest.mark.lab, pytest.mark.timeout(120)]

PEER = str(Path(__file__).with_name("peer.py"))


@pytest.fixture(scope="module")
def lab():
    with running_lab("fo", hosts=2, nics=2) as lab:
        yield lab


class Peer:
    """peer.py on a lab host, spoken to in JSON lines."""

    def __init__(self, lab: Lab, host: str, *args: str) -> None:
        argv, env = lab.exec_command(host, [sys.executable, PEER, *args])
        self.host = host
        self.proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def read(self, timeout: float = 20.0) -> dict:
        try:
            return json.loads(self.lines.get(timeout=timeout))
        except queue.Empty:
            self.proc.kill()
            raise AssertionError(f"{self.host}: no answer in {timeout}s; stderr: {self.stderr()}") from None

    def read_until(self, key: str, timeout: float = 40.0) -> dict:
        """The next line that has `key`, skipping others (state changes)."""
        deadline = time.monotonic() + timeout
        while True:
            line = self.read(max(0.1, deadline - time.monotonic()))
            if key in line:
                return line

    def send(self, **fields: object) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(fields) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # it has stopped on its own (an error): its last lines say why

    def stderr(self) -> str:
        if self.proc.poll() is None:
            self.proc.kill()
        assert self.proc.stderr is not None
        return self.proc.stderr.read()[-6000:]

    def close(self) -> int:
        try:
            return self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def shiftctl(lab: Lab, host: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv, env = lab.exec_command(host, ["shiftctl", *args])
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def failovers(lab: Lab, host: str) -> int:
    return int(json.loads(shiftctl(lab, host, "status", "--json").stdout).get("failovers", 0))


def reports_since(lab: Lab, host: str, since: float) -> list[dict]:
    """The failover reports shiftd of `host` received after `since` (time.time())."""
    lines = shiftctl(lab, host, "events", "--json", "--backlog", "100").stdout.splitlines()
    reports = [json.loads(line).get("failover") for line in lines]
    return [r for r in reports if r and int(r.get("time_unix_nanos", 0)) > since * 1e9]


def wait_for(predicate, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.1)
    return predicate()


@dataclass(frozen=True)
class Fault:
    """A real fault, and how the side that meets it first (`host`, or BOTH) should notice it."""

    host: str
    reason: str
    inject: Callable[[Lab], None]
    recover: Callable[[Lab], None]


def nic_down(host: str) -> Fault:
    """`shiftctl fail-nic mlx5_0`: shiftd sees it, so the NIC event wins."""

    def run(lab: Lab, command: str) -> None:
        result = shiftctl(lab, host, command, "mlx5_0")
        assert result.returncode == 0, result.stderr

    return Fault(host, "nic_event", lambda lab: run(lab, "fail-nic"), lambda lab: run(lab, "recover-nic"))


BOTH = "both"


def nic_down_on_both_hosts() -> Fault:
    """`shiftctl fail-nic mlx5_0` on h0 and h1 at once: each side hears its own shiftd or the peer first."""

    def run(lab: Lab, command: str) -> None:
        procs = []
        for host in ("h0", "h1"):
            argv, env = lab.exec_command(host, ["shiftctl", command, "mlx5_0"])
            procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        for proc in procs:
            assert proc.wait(timeout=30) == 0, proc.stderr.read() if proc.stderr else ""

    return Fault(BOTH, "nic_event", lambda lab: run(lab, "fail-nic"), lambda lab: run(lab, "recover-nic"))


def silent_blackhole(towards: str = "h1") -> Fault:
    """Rail 0's switch drops everything towards one host, links stay up: no shiftd sees it, h0's sends
    time out. Towards h1 the messages are lost; towards h0 only their acks are (h1 has them all)."""

    def tc(lab: Lab, *args: str) -> None:
        subprocess.run(["tc", "-n", lab.shape.rail_ns(0), "qdisc", *args], check=True)

    return Fault(
        "h0",
        "error_completion",
        lambda lab: tc(lab, "replace", "dev", towards, "root", "blackhole"),
        lambda lab: tc(lab, "del", "dev", towards, "root"),
    )


def run_stream(
    lab: Lab,
    mode: str,
    fault: Fault,
    failbacks: int = 0,
    then: dict | None = None,
    qps: int = 1,
    receiver_args: tuple[str, ...] = (),
) -> tuple[dict, dict]:
    """Stream h0 -> h1 and inject `fault` in the middle; the two peers' final reports.

    With failbacks=n, the fault is also recovered in the middle of the stream, n times over, each time once
    the sender is back on the default path, before the last injection. `then` is an order for the sender
    right after the last injection. With qps=n the stream goes round-robin over n QPs sharing one CQ.
    receiver_args go to the receiving peer.
    """
    before = {h: failovers(lab, h) for h in ("h0", "h1")}
    sender = Peer(lab, "h0", "sender", "--mode", mode, "--qps", str(qps))
    receiver = Peer(lab, "h1", "receiver", "--mode", mode, "--qps", str(qps), *receiver_args)
    injected = False
    try:
        ends = sender.read(), receiver.read()
        sender.send(**ends[1])
        receiver.send(**ends[0])
        for peer in (sender, receiver):
            connected = peer.read()
            assert connected == {"connected": True, "resilient": True, "state": "default"}, connected
        receiver.send(go=True)
        sender.send(go=True)
        assert "progress" in sender.read()
        failed_at = time.time()
        for _ in range(failbacks):
            fault.inject(lab)
            assert sender.read_until("state")["state"] == "fallback"
            fault.recover(lab)
            assert sender.read_until("state", timeout=15)["state"] == "default"
        fault.inject(lab)
        injected = True
        if then:
            sender.send(**then)
        assert sender.read_until("state")["state"] == "fallback"
        time.sleep(0.5)  # traffic on the backup path
        sender.send(stop=True)
        sent = sender.read_until("done")
        receiver.send(stop=True, expect=0 if mode == "write_read" else sent["completed"])
        received = receiver.read_until("done")
        assert sender.close() == 0, sender.stderr()
        assert receiver.close() == 0, receiver.stderr()
        # every switch happened with the stream in full flow, on both sides, in the expected order
        cycle = ["fallback", "default"] * failbacks + ["fallback"]
        for side in (sent, received) if mode != "write_read" else (sent,):
            assert [state for state, _ in side["states"]] == cycle, side
            assert side["finals"] == [cycle[-1]] * qps, side  # every QP, not only the first
            assert all(0 < at < sent["completed"] for _, at in side["states"]), side
        for host in ("h0", "h1"):  # each side switched and told its shiftd
            assert wait_for(lambda h=host: failovers(lab, h) > before[h]), f"{host} counted no failover"
            # the side that met the fault noticed it itself, the other heard the peer's notification;
            # when both met it, either may come first on each side
            mine = host == fault.host
            failover = (
                "FAILOVER_KIND_FAILOVER",
                "mlx5_0",
                "mlx5_1",
                fault.reason if mine else "peer_notification",
            )
            failback = (
                "FAILOVER_KIND_FAILBACK",
                "mlx5_1",
                "mlx5_0",
                "nic_recovered" if mine else "peer_notification",
            )
            reports = reports_since(lab, host, failed_at)
            got = sorted(
                (int(r["time_unix_nanos"]), r["kind"], r["device"], r["backup_device"], r["reason"])
                for r in reports
            )
            if fault.host == BOTH:
                assert {g[4] for g in got} <= {fault.reason, "peer_notification"}, got
                got = [(*g[:4], failover[3]) for g in got]
            assert [g[1:] for g in got] == [
                r for r in [failover, failback] * failbacks + [failover] for _ in range(qps)
            ]
        return sent, received
    finally:
        for peer in (sender, receiver):
            if peer.proc.poll() is None:
                peer.proc.kill()
                peer.proc.wait()
            if sys.exc_info()[0] is not None:  # shown by pytest with the failure
                print(f"--- {peer.host} stderr (SHIFT_TEST_LOG=INFO for more):\n{peer.stderr()}")
        if injected:
            fault.recover(lab)


@pytest.mark.parametrize("fail_host", ["h0", "h1"], ids=["sender-nic", "receiver-nic"])
def test_send_recv_survives_nic_failure(lab: Lab, fail_host: str) -> None:
    sent, received = run_stream(lab, "send", nic_down(fail_host))
    assert sent["errors"] == [] and received["errors"] == []
    assert sent["completed"] == received["received"]  # every message once, in order, checksum good


def test_send_recv_survives_nic_failure_on_both_hosts_at_once(lab: Lab) -> None:
    sent, received = run_stream(lab, "send", nic_down_on_both_hosts())
    assert sent["errors"] == [] and received["errors"] == []
    assert sent["completed"] == received["received"]


def test_write_with_imm_survives_nic_failure(lab: Lab) -> None:
    sent, received = run_stream(lab, "write_imm", nic_down("h0"))
    assert sent["errors"] == [] and received["errors"] == []
    assert sent["completed"] == received["received"]


def test_write_and_read_survive_nic_failure(lab: Lab) -> None:
    sent, _ = run_stream(lab, "write_read", nic_down("h0"))
    assert sent["errors"] == []
    assert sent["verified"] == sent["completed"]  # every READ brought back what the WRITE before it put there


def test_error_completion_detects_a_silent_blackhole(lab: Lab) -> None:
    sent, received = run_stream(lab, "send", silent_blackhole())
    assert sent["errors"] == [] and received["errors"] == []  # the RETRY_EXC_ERR never reached the app
    assert sent["completed"] == received["received"]


def test_messages_whose_acks_were_lost_are_not_sent_twice(lab: Lab) -> None:
    """h1 got every message but h0 got no ack: the receive count settles them, nothing is duplicated."""
    sent, received = run_stream(lab, "send", silent_blackhole(towards="h0"))
    assert sent["errors"] == [] and received["errors"] == []  # a duplicate would be "expected message n"
    assert sent["completed"] == received["received"]


@pytest.mark.parametrize(
    ("fail_host", "failbacks"), [("h0", 2), ("h1", 1)], ids=["sender-nic", "receiver-nic"]
)
def test_failback_after_recovery_then_failover_again(lab: Lab, fail_host: str, failbacks: int) -> None:
    """fail, recover (back on mlx5_0), then fail again: the backup was re-armed after each failback."""
    sent, received = run_stream(lab, "send", nic_down(fail_host), failbacks=failbacks)
    assert sent["errors"] == [] and received["errors"] == []
    assert sent["completed"] == received["received"]


def test_an_atomic_in_flight_is_failed_closed(lab: Lab) -> None:
    """A FETCH_AND_ADD lost in the black hole: its error reaches the application, it is never replayed,
    and the SENDs around it are delivered as usual."""
    sent, received = run_stream(lab, "send", silent_blackhole(), then={"atomic": True})
    assert sent["atomic"] in ("IBV_WC_RETRY_EXC_ERR", "IBV_WC_WR_FLUSH_ERR")
    assert received["counter"] == 0  # not executed by the black hole, not executed by a replay
    assert sent["errors"] == [] and received["errors"] == []
    assert sent["completed"] == received["received"]


def test_many_qps_on_one_cq_switch_together(lab: Lab) -> None:
    """Four QPs sharing a CQ: one NIC event moves them all, each with its own handshake, and back."""
    sent, received = run_stream(lab, "send", nic_down("h0"), failbacks=1, qps=4)
    assert sent["errors"] == [] and received["errors"] == []
    assert sent["completed"] == received["received"]


def test_a_receiver_blocked_on_its_completion_channel_follows(lab: Lab) -> None:
    """The receiver sleeps in get_cq_event: the watcher hears the peer's notification and wakes it for
    the messages that then come on the backup, and again after the failback."""
    sent, received = run_stream(lab, "send", nic_down("h0"), failbacks=1, receiver_args=("--block",))
    assert received["woken"]["events"] >= 100, received["woken"]  # it really slept and was woken
    assert received["woken"]["timeouts"] <= 20, received["woken"]
    assert sent["errors"] == [] and received["errors"] == []
    assert sent["completed"] == received["received"]
