"""A restart of shiftd under a stream loses nothing (issue 22): the agent is back at once, acts on what it
missed, and every switch it made reaches the new daemon's record exactly once.

One 2x2 lab for the module; a SEND stream h0 -> h1 over one ShiftQP pair (tests/failover/peer.py). h0's
shiftd goes away (SIGKILL; or `systemctl restart`, the supervisor's SIGTERM and new process) and its
successor is held stopped (SIGSTOP) as it starts, so that "while it is away" is a window the test owns:
h0's NIC fails there (its rail-0 switch port goes down, which no daemon sees) and comes back. Then the new
daemon serves: the agent must register within REGISTER_BUDGET of that (both instants are the new daemon's
own, from `shiftctl status`), a NIC failure just after it is back must reach the agent as a NIC event, and
the failback after it must follow. Lab names start with "dr".
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from waiting import wait_until

from libshift.api.shift.v1 import admin_pb2, common_pb2
from shiftlab.lab import Lab
from shiftlab.pids import Pid

sys.path.insert(0, str(Path(__file__).parents[1] / "failover"))
from stream_harness import Stream, admin, assert_intact, failover_reports, wait_all_up

pytestmark = [pytest.mark.lab, pytest.mark.timeout(240)]

# The agent registers this soon after the new daemon serves: the behaviour is "at once, not on a backoff
# step" (the old agent took 2.1-6.2 s, its backoff reaching 2 s). The speed target, 100 ms, is what the test
# prints and the note reports (4-18 ms in most runs here; 0.14-0.18 s in 3 of ~45 on a loaded
# 2-core machine, where relay hops waited 20-65 ms for a CPU): a timed bound that tight would fail on load.
REGISTER_BUDGET = 1.0
FAILOVER = ("FAILOVER_KIND_FAILOVER", "mlx5_0", "mlx5_1")
FAILBACK = ("FAILOVER_KIND_FAILBACK", "mlx5_1", "mlx5_0")
# no daemon to tell: the application's own link watch (nic_event) or the data path finds it
AWAY_DETECTIONS = {"nic_event", "error_completion", "peer_notification"}
LINK_DOWN_DETECTIONS = {"nic_event", "error_completion"}  # the fastest of the two, as in assert_reports


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lab = Lab(f"dr{os.getpid() % 100000}", hosts=2, nics=2)
    lab.up()
    try:
        yield lab
    finally:
        lab.down()


# ---- the lab's parts -------------------------------------------------------------------------------


def port(lab: Lab, host: str, up: bool) -> None:
    """Rail 0's switch port towards `host` up or down: the host's NIC loses (or regains) its carrier."""
    state = "up" if up else "down"
    subprocess.run(["ip", "-n", lab.shape.rail_ns(0), "link", "set", host, state], check=True)


def status(lab: Lab, host: str) -> admin_pb2.StatusResponse:
    with admin(lab, host) as stub:
        return stub.Status(admin_pb2.StatusRequest(), timeout=30)


def held_successor(lab: Lab, host: str, old: Pid) -> Pid:
    """The host's next shiftd, stopped (SIGSTOP) as soon as it exists, before it serves."""
    new = wait_until(lambda: (d := lab.daemon(host)) not in (None, old) and d, timeout=30, interval=0.005)
    assert new, f"no new shiftd on {host}"
    os.kill(new.pid, signal.SIGSTOP)  # the process the lab's supervisor just started for this test
    assert not lab.daemon_ready(host), "the new shiftd served before it could be held"
    return new


def release(lab: Lab, host: str, daemon: Pid) -> None:
    os.kill(daemon.pid, signal.SIGCONT)
    assert wait_until(lambda: lab.daemon_ready(host), timeout=30), f"shiftd on {host} did not serve"


def registered_after_serving(lab: Lab, host: str, pid: int) -> float:
    """How long after the host's daemon began serving the agent of process `pid` registered with it."""

    def registration() -> common_pb2.AgentInfo | None:
        return next((a for a in status(lab, host).agents if a.pid == pid), None)

    agent = wait_until(registration, timeout=20)
    assert agent, f"process {pid} did not register with the new shiftd on {host}"
    return (agent.registered_unix_nanos - status(lab, host).serving_unix_nanos) / 1e9


def state(stream: Stream, timeout: float = 15.0) -> str:
    """The sender's next change of state ("fallback", "default")."""
    return stream.sender.read("state", timeout=timeout)["state"]


# ---- the script the three tests share --------------------------------------------------------------


def switches_of(away: bool) -> list[tuple[str, str, str]]:
    """h0's switches in a test: the failure while the daemon is away (if any) and the one just after."""
    return [FAILOVER, FAILBACK] * (2 if away else 1)


def fail_and_fail_back_just_after(lab: Lab, stream: Stream, away: bool) -> None:
    """A NIC failure just after the daemon is back (it must come as its NIC event), then the failback."""
    port(lab, "h0", up=False)
    assert state(stream) == "fallback"
    port(lab, "h0", up=True)  # UP once past the lab's hold-down (1 s): the NIC event brings the QP home
    assert state(stream) == "default"
    # the failback is over (and reported) when the peer's count is in, a round trip after "default": a
    # stream stopped before would never finish it (as run_stream, before it stops the stream)
    failover_reports(lab, "h0", 0, wait_for=len(switches_of(away)))


def check_record(lab: Lab, since: float, away: bool) -> None:
    """h0's new daemon holds every switch of h0 exactly once, in its events and its counters; h1 too."""
    cycle = switches_of(away)
    reports = failover_reports(lab, "h0", 0, wait_for=len(cycle))  # all the new daemon ever heard
    time.sleep(1.0)  # a report counted twice would come now
    reports = failover_reports(lab, "h0", 0)
    got = [(common_pb2.FailoverKind.Name(r.kind), r.device, r.backup_device) for r in reports]
    assert got == cycle, got
    reasons = [r.reason for r in reports]
    if away:
        assert reasons[0] in AWAY_DETECTIONS, reasons
    assert reasons[-2] in LINK_DOWN_DETECTIONS and reasons[-1] == "nic_recovered", reasons
    h0 = status(lab, "h0")
    assert (h0.failovers, h0.failbacks) == (len(cycle) // 2, len(cycle) // 2)
    h1 = [r for r in failover_reports(lab, "h1", since, wait_for=len(cycle))]
    assert len(h1) == len(cycle), h1


def run_away(lab: Lab, go_away) -> None:
    """h0's shiftd goes away under a stream (`go_away`), its NIC fails and comes back meanwhile, and the
    new daemon serves: the agent is back at once and knows where its QP runs; then the failure just
    after, its failback, and the record."""
    since = time.time()
    try:
        with Stream(lab, "send") as stream:  # once every NIC is UP
            old = lab.daemon("h0")
            assert old is not None
            go_away(lab, old)
            new = held_successor(lab, "h0", old)
            port(lab, "h0", up=False)  # no daemon sees it: the data path does
            assert state(stream) == "fallback"
            # the failover report waits in the agent's queue; shiftctl status would now say the QP is away
            port(lab, "h0", up=True)  # the NIC comes back while the daemon is away
            release(lab, "h0", new)
            took = registered_after_serving(lab, "h0", stream.sender.pid)
            print(f"\nagent re-registered {took * 1e3:.1f} ms after the new shiftd began serving")
            assert took < REGISTER_BUDGET, f"{took * 1e3:.1f} ms"
            # the snapshot says mlx5_0 is UP: the QP comes home (or already has, from its own probe)
            assert state(stream) == "default"
            # that failback is over once the peer's count is in: a fault before it would merge the two
            # switches into one move (as under load, when the count came after the next port down)
            failover_reports(lab, "h0", 0, wait_for=2)
            fail_and_fail_back_just_after(lab, stream, away=True)
            sent, received = stream.finish()
            assert_intact(sent, received)
            check_record(lab, since, away=True)
            assert all(a.qps_on_backup == 0 for a in status(lab, "h0").agents)
    finally:
        port(lab, "h0", up=True)


def sigkill(lab: Lab, old: Pid) -> None:
    os.kill(old.pid, signal.SIGKILL)  # the daemon this test's lab started


def systemctl_restart(lab: Lab, old: Pid) -> None:
    lab.restart_daemon("h0")  # SIGTERM, a clean stop, and a new process


# ---- the tests -------------------------------------------------------------------------------------


def test_a_sigkilled_shiftd_loses_nothing_of_a_stream(lab: Lab) -> None:
    run_away(lab, sigkill)


def test_a_restarted_shiftd_loses_nothing_of_a_stream(lab: Lab) -> None:
    restarts = lab.restarts("h0")
    run_away(lab, systemctl_restart)
    assert lab.restarts("h0") == restarts + 1


def test_shiftd_down_when_the_application_starts(lab: Lab) -> None:
    """The application starts while h0's shiftd is away: its agent waits on the held socket, registers the
    moment the daemon serves, and the stream is resilient from the start."""
    wait_all_up(lab)
    since = time.time()
    old = lab.daemon("h0")
    assert old is not None
    sigkill(lab, old)
    new = held_successor(lab, "h0", old)
    # its agent's register waits in the held socket's backlog
    stream = Stream(lab, "send", healthy_first=False)
    failed = True
    try:
        time.sleep(2.0)  # the peers start (imports, contexts) while the daemon is away
        release(lab, "h0", new)
        took = registered_after_serving(lab, "h0", stream.sender.pid)
        print(f"\nagent registered {took * 1e3:.1f} ms after the new shiftd began serving")
        assert took < REGISTER_BUDGET, f"{took * 1e3:.1f} ms"
        stream.start(timeout=30)
        fail_and_fail_back_just_after(lab, stream, away=False)
        sent, received = stream.finish()
        assert_intact(sent, received)
        check_record(lab, since, away=False)
        failed = False
    finally:
        stream.end(failed)
        port(lab, "h0", up=True)
