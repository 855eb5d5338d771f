"""A third NIC: with three NICs per host, a failure of the backup while the traffic is on it moves the
stream on to the third NIC instead of surfacing an error (as it must with two, test_second_faults.py).

A QP on mlx5_0 goes mlx5_0 (default) -> mlx5_1 (backup) -> mlx5_2 (third), and fails back straight home to
mlx5_0 from whichever backup it is on. The lab is 2 hosts x 3 NICs, one for the module. peer.py says
"fallback" for both backups, so what moved where is read off shiftd's switch reports; a move that stalls
would pass assert_intact (the counts still agree), so each test also checks the sender kept its pace.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from labs import running_lab
from stream_harness import (
    FEW_REAL_EXAMPLES,
    Step,
    Stream,
    assert_clean_error,
    assert_intact,
    assert_switched,
    failover_reports,
    fault_steps,
    nic_fault,
    rail_qdisc,
    recover_everything,
    recover_nic,
    switches,
    wait_nic_state,
)

from libshift.api.shift.v1 import common_pb2
from shiftlab.lab import Lab

pytestmark = [pytest.mark.lab, pytest.mark.timeout(120)]

RATE = 1000.0  # peer.py's default --rate, messages a second
Switch = tuple[str, str, str, str]


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with running_lab("f3", hosts=2, nics=3) as lab:
        yield lab


def failover(left: int, used: int, reason: str) -> Switch:
    return ("FAILOVER_KIND_FAILOVER", f"mlx5_{left}", f"mlx5_{used}", reason)


def failback(left: int, reason: str) -> Switch:
    return ("FAILOVER_KIND_FAILBACK", f"mlx5_{left}", "mlx5_0", reason)


MOVED_ON = {  # h0's mlx5_0 failed, then its mlx5_1: h0 noticed each, h1 followed
    "h0": [failover(0, 1, "nic_event"), failover(1, 2, "nic_event")],
    "h1": [failover(0, 1, "peer_notification"), failover(1, 2, "peer_notification")],
}


def assert_switches(lab: Lab, since: float, expected: dict[str, list[Switch]]) -> None:
    """Each host's shiftd was told of exactly `expected[host]` since `since`. As in assert_reports, an
    error completion is as good as the NIC event on the side that met the fault."""

    def same(got: Switch, want: Switch) -> bool:
        return got == want or (got[:3] == want[:3] and (got[3], want[3]) == ("error_completion", "nic_event"))

    for host, want in expected.items():
        got = switches(lab, host, since, wait_for=len(want))
        assert len(got) == len(want) and all(map(same, got, want)), f"{host}: {got}, expected {want}"


def assert_kept_pace(completed: int, at: int, seconds: float) -> None:
    """From `at` completed messages, `seconds` of streaming completed at least half of what the sender
    was due to post in that time: it did not stall on any of the paths."""
    assert completed - at >= RATE * seconds / 2, f"{completed - at} messages completed in {seconds:.1f} s"


def fail_over(lab: Lab, stream: Stream, seconds: float) -> float:
    """Fail h0's mlx5_0 and let the stream run `seconds` on the backup; when the sender got there."""
    nic_fault("h0").inject(lab)
    assert stream.sender.read("state")["state"] == "fallback"
    moved = time.monotonic()
    time.sleep(seconds)
    return moved


def finish_after(stream: Stream, start: float, seconds: float) -> tuple[dict, dict, float]:
    """Let the stream run `seconds` more and finish it: both reports, and how long it ran since `start`."""
    time.sleep(seconds)
    streamed = time.monotonic() - start
    sent, received = stream.finish()
    return sent, received, streamed


def assert_stayed_moved(sent: dict, received: dict, streamed: float) -> None:
    """A stream moved off the default path once (as the peers saw it), ended there intact, and kept its
    pace for the `streamed` seconds since."""
    assert_intact(sent, received)
    assert_switched(sent, received, "send", ["fallback"])
    assert sent["finished"], sent
    assert_kept_pace(sent["completed"], sent["states"][0][1], streamed)


def test_a_failure_of_the_backup_moves_the_stream_on_to_the_third_nic(lab: Lab) -> None:
    """h0's mlx5_0 fails, then its mlx5_1 with the traffic on it: the stream moves on to mlx5_2 and keeps
    flowing. Once mlx5_0 (and mlx5_1) are back it goes straight home to mlx5_0, led by h0."""
    try:
        with Stream(lab, "send") as stream:
            since = time.time()
            start = fail_over(lab, stream, 0.5)
            nic_fault("h0", device="mlx5_1").inject(lab)
            assert_switches(lab, since, MOVED_ON)
            time.sleep(1.0)  # traffic on mlx5_2
            recover_nic(lab, ["h0"], ["mlx5_0", "mlx5_1"])
            assert stream.sender.read("state", timeout=15)["state"] == "default"
            on_backups = time.monotonic() - start  # 0.5 s on mlx5_1, the rest on mlx5_2
            time.sleep(0.3)  # traffic on the default path again
            sent, received = stream.finish()
    finally:
        recover_everything(lab)
    assert_intact(sent, received)
    assert_switched(sent, received, "send", ["fallback", "default"])
    (_, left_at), (_, home_at) = sent["states"]
    assert_kept_pace(home_at, left_at, on_backups)
    home = {"h0": failback(2, "nic_recovered"), "h1": failback(2, "peer_notification")}  # h0 led it
    assert_switches(lab, since, {host: [*MOVED_ON[host], home[host]] for host in home})


@pytest.mark.parametrize("mode", ["write_imm", "write_read"])
def test_one_sided_traffic_reaches_the_third_nic_with_its_keys(lab: Lab, mode: str) -> None:
    """WRITE_WITH_IMM and WRITE+READ streams across both moves: on mlx5_2 every WR carries the peer's
    rkey of its MR's twin there, found along the published chain (default rkey -> backup rkey ->
    backup2 rkey); a wrong key would fail remotely (REM_ACCESS_ERR) or READ back the wrong bytes."""
    try:
        with Stream(lab, mode) as stream:
            since = time.time()
            fail_over(lab, stream, 0.3)
            nic_fault("h0", device="mlx5_1").inject(lab)
            assert_switches(lab, since, MOVED_ON if mode == "write_imm" else {"h0": MOVED_ON["h0"]})
            time.sleep(0.5)  # traffic on mlx5_2
            sent, received = stream.finish()
    finally:
        recover_everything(lab)
    assert sent["errors"] == [] and sent["failed"] == [], sent
    if mode == "write_imm":
        assert_intact(sent, received)
    else:
        assert sent["verified"] == sent["completed"]  # every READ brought back what the WRITE put there


def test_a_failure_of_the_peers_backup_moves_both_on_to_the_third_nic(lab: Lab) -> None:
    """h0's mlx5_0 fails, then h1's mlx5_1 with the traffic on it: h1 moves on to mlx5_2 on its own NIC
    event and h0 follows h1's notification; the stream keeps flowing there."""
    try:
        with Stream(lab, "send") as stream:
            since = time.time()
            start = fail_over(lab, stream, 0.5)
            nic_fault("h1", device="mlx5_1").inject(lab)
            assert_switches(
                lab,
                since,
                {
                    "h0": [failover(0, 1, "nic_event"), failover(1, 2, "peer_notification")],
                    "h1": [failover(0, 1, "peer_notification"), failover(1, 2, "nic_event")],
                },
            )
            sent, received, streamed = finish_after(stream, start, 1.0)  # traffic on mlx5_2
    finally:
        recover_everything(lab)
    assert_stayed_moved(sent, received, streamed)


def test_a_backup_that_failed_before_it_was_needed_is_skipped(lab: Lab) -> None:
    """h0's mlx5_1 fails while the stream is on the default path (nothing moves), then its mlx5_0: the
    stream goes straight to mlx5_2."""
    try:
        with Stream(lab, "send") as stream:
            since = time.time()
            nic_fault("h0", device="mlx5_1").inject(lab)
            wait_nic_state(lab, "h0", "mlx5_1", "NIC_STATE_DOWN")
            time.sleep(0.3)  # traffic on the default path, the backup down
            nic_fault("h0").inject(lab)
            assert stream.sender.read("state")["state"] == "fallback"
            start = time.monotonic()
            assert_switches(
                lab,
                since,
                {"h0": [failover(0, 2, "nic_event")], "h1": [failover(0, 2, "peer_notification")]},
            )
            sent, received, streamed = finish_after(stream, start, 1.0)  # traffic on mlx5_2
    finally:
        recover_everything(lab)
    assert_stayed_moved(sent, received, streamed)


def test_a_backup_whose_nic_came_back_is_armed_again(lab: Lab) -> None:
    """h0's mlx5_1 fails while the stream is on the default path and comes back (shiftd says UP): h0 asks
    h1 to re-arm that path and arms its own side on the answer, so when mlx5_0 fails next the stream
    goes to mlx5_1 again, not on to mlx5_2."""
    try:
        with Stream(lab, "send") as stream:
            nic_fault("h0", device="mlx5_1").inject(lab)
            wait_nic_state(lab, "h0", "mlx5_1", "NIC_STATE_DOWN")
            recover_nic(lab, ["h0"], ["mlx5_1"])
            wait_nic_state(lab, "h0", "mlx5_1", "NIC_STATE_UP")
            stream.wait_armed("backup")  # the re-arm handshake, on the default path
            since = time.time()
            nic_fault("h0").inject(lab)
            assert stream.sender.read("state")["state"] == "fallback"
            assert_switches(
                lab,
                since,
                {"h0": [failover(0, 1, "nic_event")], "h1": [failover(0, 1, "peer_notification")]},
            )
            time.sleep(0.5)  # traffic on mlx5_1
            sent, received = stream.finish()
    finally:
        recover_everything(lab)
    assert_intact(sent, received)
    assert_switched(sent, received, "send", ["fallback"])


def test_home_from_the_third_nic_with_both_backups_armed_again(lab: Lab) -> None:
    """After the move on to mlx5_2 and the way home (mlx5_0 and mlx5_1 back), both backups are armed
    again: mlx5_2 as it is left (each side arms it as it switches back), mlx5_1 by a re-arm request once
    home. So mlx5_0's next failure moves the stream to mlx5_1, and mlx5_1's next one on to mlx5_2."""
    try:
        with Stream(lab, "send") as stream:
            since = time.time()
            nic_fault("h0").inject(lab)
            assert stream.sender.read("state")["state"] == "fallback"
            nic_fault("h0", device="mlx5_1").inject(lab)
            assert_switches(lab, since, MOVED_ON)
            recover_nic(lab, ["h0"], ["mlx5_0", "mlx5_1"])
            assert stream.sender.read("state", timeout=15)["state"] == "default"
            wait_nic_state(lab, "h0", "mlx5_1", "NIC_STATE_UP")
            stream.wait_armed("backup")  # the re-arm handshake for mlx5_1, on the default path
            stream.wait_armed("backup2")  # armed as it was left
            again = time.time()
            fail_over(lab, stream, 0.3)
            nic_fault("h0", device="mlx5_1").inject(lab)
            assert_switches(lab, again, MOVED_ON)
            time.sleep(0.3)  # traffic on mlx5_2
            sent, received = stream.finish()
    finally:
        recover_everything(lab)
    assert_intact(sent, received)
    assert_switched(sent, received, "send", ["fallback", "default", "fallback"])


def test_a_failure_in_the_middle_of_the_handshake_moves_on_to_the_third_nic(lab: Lab) -> None:
    """h0's mlx5_0 fails with rail 1's switch dropping everything towards h1, so h0's count on mlx5_1
    never arrives and the ack deadline of that handshake fires: h0 moves on to mlx5_2 before its move to
    mlx5_1 resumed, and h1 follows there straight from the default path. Each side reports one move,
    mlx5_0 -> mlx5_2 (h0 with its first detection's reason). After the drop ends (TCP may retransmit the
    old count), the stream stays on mlx5_2, intact."""
    try:
        with Stream(lab, "send") as stream:
            since = time.time()
            rail_qdisc(lab, 1, "h1", "blackhole")
            try:
                nic_fault("h0").inject(lab)
                assert_switches(  # h0's move to mlx5_1 never resumed: one move, reported as such
                    lab,
                    since,
                    {"h0": [failover(0, 2, "nic_event")], "h1": [failover(0, 2, "peer_notification")]},
                )
            finally:
                rail_qdisc(lab, 1, "h1")
            time.sleep(2.0)  # traffic on mlx5_2, with mlx5_1 open again
            sent, received = stream.finish()
    finally:
        recover_everything(lab)
    assert_intact(sent, received)
    assert_switches(lab, since, {"h1": [failover(0, 2, "peer_notification")]})  # and nothing after it


def test_a_failure_of_the_third_nic_surfaces_cleanly(lab: Lab) -> None:
    """h0's mlx5_0, mlx5_1 and mlx5_2 fail one after the other on the stream: after two moves there is
    nowhere to go. The error reaches the application, nothing is delivered twice, nothing hangs, and
    shiftd is told of no third switch."""
    try:
        with Stream(lab, "send") as stream:
            since = time.time()
            fail_over(lab, stream, 0.3)
            nic_fault("h0", device="mlx5_1").inject(lab)
            assert_switches(lab, since, MOVED_ON)
            time.sleep(0.3)  # traffic on mlx5_2
            nic_fault("h0", device="mlx5_2").inject(lab)
            sent, received = stream.finish(stop=False)  # the sender stops at its error
    finally:
        recover_everything(lab)
    assert_clean_error(sent, received)
    # finals, not states: the sender stops polling at its last completion, before it may see "broken"
    assert sent["states"][0][0] == "fallback" and sent["finals"] == ["broken"], sent
    assert_switches(lab, since, MOVED_ON)  # nothing after the two moves


# mlx5_2 stays healthy, so the stream always has a path
steps = fault_steps(devices=("mlx5_0", "mlx5_1"))


def wait_home(lab: Lab, since: float, timeout: float = 20.0) -> None:
    """Until h0's last switch since `since` is a failback (or it made none): the stream is home."""
    deadline = time.monotonic() + timeout
    while True:
        reports = failover_reports(lab, "h0", since)
        if not reports or reports[-1].kind == common_pb2.FAILOVER_KIND_FAILBACK:
            return
        assert time.monotonic() < deadline, f"not home after {timeout:g} s: {reports[-1]}"
        time.sleep(0.3)


@FEW_REAL_EXAMPLES
@example(  # h0's backup dies first; then h1's default: h1's count on mlx5_1 meets the ack deadline
    plan=[Step("h0", "down", "never", "mlx5_1"), Step("h1", "down", "end", "mlx5_0")]
)
@example(  # found by a draw: h0 moved to mlx5_1 while h1's flapped; h1 took h0's count there (its link up
    # for a moment) but would not follow onto a path it counted as down, and h0 waited for h1's count
    plan=[Step("h1", "flap", "never", "mlx5_1"), Step("h0", "blackhole", "end", "mlx5_0")]
)
@given(plan=st.lists(steps, min_size=1, max_size=3, unique_by=lambda step: (step.host, step.device)))
def test_no_fault_schedule_short_of_the_third_nic_breaks_the_stream(lab: Lab, plan: list[Step]) -> None:
    """Property: with mlx5_2 healthy on both hosts there is always a path, so whichever of the other
    NICs fail, in whatever order, recovered or not, every message arrives exactly once and in order and
    no error reaches either application; the stream ends on the default path exactly when every
    mlx5_0 fault was recovered."""
    home = not any(step.device == "mlx5_0" and step.recover == "never" for step in plan)
    try:
        with Stream(lab, "send") as stream:
            since = time.time()
            for step in plan:
                period = 0.4 if step.mode == "flap" else 0.0
                nic_fault(step.host, step.mode, step.device, period).inject(lab)
                time.sleep(0.4)  # traffic wherever it went
                if step.recover == "next":
                    recover_up(lab, step)
            for step in plan:
                if step.recover == "end":
                    recover_up(lab, step)
            if home:
                wait_home(lab, since)
            time.sleep(0.3)
            sent, received = stream.finish()
    finally:
        recover_everything(lab)
    assert_intact(sent, received)
    final = "default" if home else "fallback"
    assert sent["finals"] == [final] and received["finals"] == [final], (sent, received)


def recover_up(lab: Lab, step: Step) -> None:
    """Recover the step's NIC and wait until its shiftd says UP (past the hold-down)."""
    nic_fault(step.host, device=step.device).recover(lab)
    wait_nic_state(lab, step.host, step.device, "NIC_STATE_UP")
    time.sleep(0.3)  # the re-arm on both sides
