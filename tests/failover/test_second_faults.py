"""A second fault while a stream is already failing over: in the middle of the handshake, or on the backup.

The handshake window is held open for real: rail 1's switch drops everything towards h1 (the receive count
h0 sends when it switches stays in flight, TCP keeps retransmitting it) until the second fault is in, then
lets it through. The peers use a long ack deadline so that holding the count is not itself a failure:
after the release TCP retransmits it within about as long again as it was held (exponential backoff),
so each test checks that the hold lasted less than half the deadline. With two NICs, a failure of the
path being moved to has nowhere to go: the applications get a clear error, never a message twice, and
nothing hangs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from stream_harness import (
    BOTH,
    HOSTS,
    Stream,
    assert_clean_error,
    assert_intact,
    assert_reports,
    assert_switched,
    frames_held,
    nic_fault,
    rail_qdisc,
    recover_everything,
    switches,
    wait_nic_state,
)

from libshift.core import wire
from shiftlab.lab import Lab

pytestmark = [pytest.mark.lab, pytest.mark.timeout(120)]

PATIENT = ("--timeout", "18", "--retry-cnt", "7")  # ack deadline: 4.096 us x 2**18 x 8 tries = 8.6 s
VERY_PATIENT = ("--timeout", "19", "--retry-cnt", "7")  # 17.2 s, for a hold that waits out a hold-down
FAILOVER = ("FAILOVER_KIND_FAILOVER", "mlx5_0", "mlx5_1")
FAILBACK = ("FAILOVER_KIND_FAILBACK", "mlx5_1", "mlx5_0")
FAILOVER_ON_NIC_EVENT = (*FAILOVER, "nic_event")


def ack_deadline(args: tuple[str, ...]) -> float:
    timeout, retry_cnt = int(args[1]), int(args[3])
    return 4.096e-6 * (1 << timeout) * (retry_cnt + 1)


@contextmanager
def handshake_held(lab: Lab, stream: Stream, patience: tuple[str, ...]) -> Iterator[None]:
    """Fail mlx5_0 on h0 with h0's notification to h1 held on the backup rail; release it on exit."""
    rail_qdisc(lab, 1, "h1", "blackhole")
    start = time.monotonic()
    try:
        nic_fault("h0").inject(lab)
        assert stream.sender.read("state")["state"] == "fallback"
        yield
    finally:
        rail_qdisc(lab, 1, "h1")
    held = time.monotonic() - start
    assert held < ack_deadline(patience) / 2, f"held {held:.1f} s: its retransmit may outlast the deadline"


def patient_stream(lab: Lab, patience: tuple[str, ...]) -> Stream:
    return Stream(lab, "send", sender_args=patience, receiver_args=patience)


def finish_at_home(stream: Stream) -> tuple[dict, dict]:
    """Wait for the sender's move back to the default path, let traffic flow there, and finish."""
    assert stream.sender.read("state", timeout=15)["state"] == "default"
    time.sleep(0.3)  # traffic on the default path again
    return stream.finish()


def assert_ended_on_the_backup(sent: dict, received: dict) -> None:
    assert_intact(sent, received)
    assert sent["finals"] == ["fallback"] and received["finals"] == ["fallback"], (sent, received)


def test_the_peers_default_fails_during_the_handshake(lab: Lab) -> None:
    """h1's NIC fails while h0's notification is in flight: h1 switches on its own NIC event (not on
    the notification), both handshakes cross, the stream survives."""
    try:
        with patient_stream(lab, VERY_PATIENT) as stream:
            since = time.time()
            with handshake_held(lab, stream, VERY_PATIENT):
                nic_fault("h1").inject(lab)
                assert stream.receiver.read("state")["state"] == "fallback"  # before the notification
            time.sleep(0.5)  # traffic on the backup path
            sent, received = stream.finish()
    finally:
        recover_everything(lab)
    assert_intact(sent, received)
    assert_switched(sent, received, "send", ["fallback"])
    for host in HOSTS:  # each side noticed on its own: the second fault landed inside the handshake
        assert switches(lab, host, since, wait_for=1) == [FAILOVER_ON_NIC_EVENT], host


def test_the_default_recovers_and_fails_again_during_the_handshake(lab: Lab) -> None:
    """h0's NIC comes back (shiftd says UP) and fails again before h1 has answered: the switch completes
    on the backup and stays there, the stream survives."""
    try:
        with patient_stream(lab, VERY_PATIENT) as stream:
            since = time.time()
            with handshake_held(lab, stream, VERY_PATIENT):
                nic_fault("h0").recover(lab)
                wait_nic_state(lab, "h0", "mlx5_0", "NIC_STATE_UP")
                nic_fault("h0").inject(lab)
            for host in HOSTS:  # the held count is retransmitted after the release: both have switched
                switches(lab, host, since, wait_for=1)
            time.sleep(0.5)  # and the stream flows on the backup
            sent, received = stream.finish()
    finally:
        recover_everything(lab)
    assert_intact(sent, received)
    assert_switched(sent, received, "send", ["fallback"])
    assert_reports(lab, since, nic_fault("h0"), 1)


@pytest.mark.parametrize("host", ["h1", "h0"], ids=["receivers-backup", "senders-backup"])
def test_the_backup_fails_during_the_handshake(lab: Lab, host: str) -> None:
    """mlx5_1 fails while h0's notification is in flight on it. On h1 it is lost (h0 finds out by the ack
    deadline); on h0 shiftd says so at once. Either way h0's application gets a clear error. h1 never heard
    of the switch. Its QP has no path left either way (h0's mlx5_0 failed first, then one side's mlx5_1),
    and h1 may learn it before it is told to stop (lost.py): from etcd, through its shiftd, that both of
    h0's NICs are down; or that h0's mlx5_0 is, once its own mlx5_1 has gone."""
    try:
        with patient_stream(lab, PATIENT) as stream:
            with handshake_held(lab, stream, PATIENT):
                nic_fault(host, device="mlx5_1").inject(lab)
            sent, received = stream.finish(stop=False)
    finally:
        recover_everything(lab)
    assert_clean_error(sent, received)
    assert sent["finals"] == ["broken"], sent
    assert received["finals"] in [["default"], ["broken"]], received


@pytest.mark.parametrize("host", ["h0", "h1"], ids=["senders-nics", "receivers-nics"])
def test_a_failure_of_the_backup_with_no_third_nic_surfaces_cleanly(lab: Lab, host: str) -> None:
    """On the backup after mlx5_0 failed, mlx5_1 of the same host fails too: with two NICs there is
    nowhere to go. The error reaches the application (the host's shiftd says so at once; the other side
    meets the ack deadline), nothing is delivered twice, nothing hangs."""
    try:
        with Stream(lab, "send") as stream:
            since = time.time()
            nic_fault(host).inject(lab)
            assert stream.sender.read("state")["state"] == "fallback"
            time.sleep(0.3)  # traffic on the backup path
            nic_fault(host, device="mlx5_1").inject(lab)
            sent, received = stream.finish(stop=False)  # the sender stops at its error
    finally:
        recover_everything(lab)
    assert_clean_error(sent, received)
    assert sent["states"][0][0] == "fallback" and sent["finals"] == ["broken"], sent
    if host == "h1":  # the receiver's posted receives flushed: it is not left waiting for messages
        assert received["failed"] and received["finals"] == ["broken"], received
    assert_reports(lab, since, nic_fault(host), 1)  # the failover, and nothing after it


def test_failback_waits_for_the_second_nic_to_recover(lab: Lab) -> None:
    """mlx5_0 fails on both hosts; h0's comes back first and asks h1 to re-arm the default path while
    h1's is still down. h1 must not answer (a probe would fail and leave h0 waiting for an UP that
    never comes again); h1's own recovery then brings both back, once."""
    try:
        with Stream(lab, "send") as stream:
            since = time.time()
            nic_fault(BOTH).inject(lab)
            assert stream.sender.read("state")["state"] == "fallback"
            nic_fault("h0").recover(lab)
            wait_nic_state(lab, "h0", "mlx5_0", "NIC_STATE_UP")
            time.sleep(1.5)  # room for h0's re-arm request and a probe to time out, were one sent
            nic_fault("h1").recover(lab)
            sent, received = finish_at_home(stream)
    finally:
        recover_everything(lab)
    assert_intact(sent, received)
    assert_switched(sent, received, "send", ["fallback", "default"])
    assert [s[:3] for s in switches(lab, "h0", since, wait_for=2)][1:] == [FAILBACK]
    assert switches(lab, "h1", since, wait_for=2)[1:] == [(*FAILBACK, "nic_recovered")]  # h1 led it


def test_the_peers_default_fails_during_the_failbacks_handshake(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race a 20-minute soak met. h0's NIC comes back and h0 leads the failback; h1 follows at once
    (it has h0's count) and answers with its own count, which rail 0 holds; then h1's default NIC fails and
    h1 moves to the backup. h0, waiting on the default path for a count that does not come, must take
    h1's notification on the backup (armed when it switched back) and follow: the stream survives."""
    monkeypatch.setenv("SHIFT_DETECT_TIMEOUT", "18")  # the default path's deadline, 8.6 s: h0's count,
    monkeypatch.setenv("SHIFT_DETECT_RETRY_CNT", "7")  # whose ack rides on the held one, is late, not lost
    try:
        with patient_stream(lab, VERY_PATIENT) as stream:
            since = time.time()
            nic_fault("h0").inject(lab)
            assert stream.sender.read("state")["state"] == "fallback"
            assert stream.receiver.read("state")["state"] == "fallback"
            with frames_held(lab, 0, "h0", wire.Op.WRITE_IMM):  # the counts h1 sends h0 on the default rail
                nic_fault("h0").recover(lab)
                assert stream.receiver.read("state", timeout=20)["state"] == "default"  # its count is held
                assert stream.sender.read("state")["state"] == "default"  # switched back, waiting for it
                nic_fault("h1").inject(lab)
                assert stream.receiver.read("state")["state"] == "fallback"
                assert stream.sender.read("state")["state"] == "fallback"  # followed h1 while still held
            time.sleep(0.5)  # traffic on the backup path
            sent, received = stream.finish()
    finally:
        recover_everything(lab)
    assert_ended_on_the_backup(sent, received)
    followed = [(*FAILOVER, "peer_notification"), (*FAILBACK, "peer_notification"), (*FAILOVER, "nic_event")]
    assert switches(lab, "h1", since, wait_for=3) == followed
    # h0's failback never resumed (h1's count on the default path was held): no report of it
    assert switches(lab, "h0", since, wait_for=2) == [
        (*FAILOVER, "nic_event"),
        (*FAILOVER, "peer_notification"),
    ]


def test_the_default_path_fails_during_the_failbacks_handshake(lab: Lab) -> None:
    """h0 leads a failback and h1's count on the default path never comes (rail 0 holds it, a black hole
    that no shiftd sees). h1, which had resumed, meets the ack deadline of its held count. h0's own count
    meets its deadline too, unless h1 acknowledged it with an ACK of its own before sending its count
    (which would carry the ack: a slow switch on h1 lets its ACK timer go first). Whichever deadline
    fires first leaves the default path with error_completion, for the backup re-armed at the switch
    back, and its notification there brings the other side, unless that side's deadline fired
    meanwhile: both go to the backup, and at least one of them left on its own deadline. A side that left
    on its deadline tries the default path again RETRY_FIRST (1 s) later (rearm.py): once the hold is
    lifted that brings both home, if the stream is still running then (CI's slow hours)."""
    try:
        with Stream(lab, "send") as stream:
            since = time.time()
            nic_fault("h0").inject(lab)
            assert stream.sender.read("state")["state"] == "fallback"
            with frames_held(lab, 0, "h0", wire.Op.WRITE_IMM):
                nic_fault("h0").recover(lab)
                assert stream.sender.read("state", timeout=20)["state"] == "default"
                assert stream.sender.read("state")["state"] == "fallback"
                for host in HOSTS:
                    switches(lab, host, since, wait_for=2)
            time.sleep(0.5)  # traffic on the backup path
            sent, received = stream.finish()
            # checked in the stream's block, so that a failure shows what the peers logged
            retried = sent["finals"] == ["default"]  # the retry came before the stream's end
            if retried:
                assert_intact(sent, received)
                assert received["finals"] == ["default"], received
            else:
                assert_ended_on_the_backup(sent, received)
            on_deadline, followed = (*FAILOVER, "error_completion"), (*FAILOVER, "peer_notification")
            h0 = switches(lab, "h0", since, wait_for=2 + retried)
            assert h0[:1] == [(*FAILOVER, "nic_event")], h0
            assert h0[1:2] in ([on_deadline], [followed]), h0
            h1 = switches(lab, "h1", since, wait_for=3 + retried)
            assert h1[:2] == [(*FAILOVER, "peer_notification"), (*FAILBACK, "peer_notification")], h1
            assert h1[2:3] in ([on_deadline], [followed]), h1
            assert on_deadline in (h0[1], h1[2]), (h0, h1)  # somebody's deadline began it
            # the retry: the side that left on its deadline probes and leads, the other follows
            home = sorted([(*FAILBACK, "nic_recovered"), (*FAILBACK, "peer_notification")])
            assert sorted(h0[2:] + h1[3:]) == (home if retried else []), (h0, h1)
    finally:
        recover_everything(lab)


def test_a_failed_probe_is_tried_again(lab: Lab) -> None:
    """h0's NIC comes back while rail 0 silently drops everything towards h1, so the failback's probe
    fails. No NIC UP will come again: h0 tries the default path again a second later (then backing off),
    and once the black hole is lifted a try brings the stream home."""
    try:
        with Stream(lab, "send") as stream:
            since = time.time()
            nic_fault("h0").inject(lab)
            assert stream.sender.read("state")["state"] == "fallback"
            rail_qdisc(lab, 0, "h1", "blackhole")
            try:
                nic_fault("h0").recover(lab)
                wait_nic_state(lab, "h0", "mlx5_0", "NIC_STATE_UP")
                time.sleep(1.0)  # the re-arm, and a probe that meets the ack deadline (67 ms)
            finally:
                rail_qdisc(lab, 0, "h1")
            sent, received = finish_at_home(stream)
    finally:
        recover_everything(lab)
    assert_intact(sent, received)
    assert_switched(sent, received, "send", ["fallback", "default"])
    assert_reports(lab, since, nic_fault("h0"), 2)  # h0 led the failback (nic_recovered), h1 followed
