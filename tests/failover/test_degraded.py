"""A link that loses packets, or runs far slower than it did, while it stays up (issue 20's degraded paths):
shiftd's judges see it in the NIC's TCP traffic (its retransmissions; the rate of what the network held
back against the NIC's best), report the NIC DEGRADED (retransmits, slow) and tell the agents to move off
it; the stream comes home once the link has been clean for the judge's hold (the lab's: 5 s)."""

from __future__ import annotations

import threading
import time

import pytest
from linkprobe import tcp_rate
from stream_harness import Stream, admin, assert_intact, switches

from libshift.api.shift.v1 import admin_pb2, common_pb2
from shiftlab.lab import Lab
from shiftlab.switch import lossy_port, slow_port

pytestmark = [pytest.mark.lab, pytest.mark.timeout(240)]

LOSS = 10.0  # percent, both ways, on rail 0's switch port towards h0


def degraded_nics(lab: Lab) -> dict[str, str]:
    """host -> the reason of its mlx5_0 while DEGRADED."""
    found = {}
    for host in lab.host_names:
        with admin(lab, host) as stub:
            nics = stub.ListNics(admin_pb2.ListNicsRequest(), timeout=30).nics
        for nic in nics:
            if nic.device == "mlx5_0" and nic.state == common_pb2.NIC_STATE_DEGRADED:
                found[host] = nic.reason
    return found


def test_a_lossy_link_moves_the_stream_off_and_it_comes_home_once_clean(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No shiftd is told of the fault (it is on the switch) and the link stays up; the default path's ack
    deadline is set to 4.3 s (timeout 18, in libshift's detection and in the peers' own QP attributes,
    the shorter of which counts), so the move within it is the judge's: a NIC event (move_off) from
    whichever host's shiftd judged its mlx5_0 first (both see the loss: each end retransmits what the port
    drops). With the peers' own 0.54 s, a loaded CI machine's judge was once too slow for it."""
    monkeypatch.setenv("SHIFT_DETECT_TIMEOUT", "18")  # the peers inherit the test's environment
    since = time.time()
    patient = ("--timeout", "18")
    with Stream(lab, "send", sender_args=patient, receiver_args=patient) as stream:
        with lossy_port(lab, 0, "h0", LOSS):
            assert stream.sender.read("state", timeout=10)["state"] == "fallback"
            reasons = degraded_nics(lab)
        print(f"\nDEGRADED while the port lost {LOSS:g}%: {reasons}")
        assert set(reasons.values()) == {"retransmits"}, reasons
        # the link is clean again: the judge's hold passes with nothing lost, the NICs are UP, the stream home
        assert stream.sender.read("state", timeout=15)["state"] == "default"
        sent, received = stream.finish()
    assert_intact(sent, received)
    for host in lab.host_names:
        moves = switches(lab, host, since, wait_for=2)
        kinds = [(kind, left, used) for kind, left, used, _ in moves]
        assert kinds == [
            ("FAILOVER_KIND_FAILOVER", "mlx5_0", "mlx5_1"),
            ("FAILOVER_KIND_FAILBACK", "mlx5_1", "mlx5_0"),
        ], f"{host}: {moves}"
        assert moves[0][3] in ("nic_event", "peer_notification"), f"{host}: {moves}"
    assert "nic_event" in {switches(lab, host, since)[0][3] for host in lab.host_names}


SLOW = 20_000_000  # bits a second, on rail 0's switch port towards h1


def test_a_slow_link_moves_the_stream_off_and_it_comes_home_once_fast(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bulk TCP stream from h0 to h1 over rail 0 beside the shift stream (any TCP traffic over the NIC is
    evidence); the switch's port towards h1 is shaped to 20 Mbit/s behind a queue deep enough that nothing
    is lost (else the loss judge finds it first: a shaper that drops is a lossy link), no shiftd told. h0's
    speed judge finds the bulk stream held back far below the NIC's best and moves the QPs off mlx5_0 (the
    ack deadline is set long, as above, so the move is the judge's); h1, whose sockets only answer, follows
    by the stream's notification. The port fast again, the stream comes home after the judge's hold."""
    monkeypatch.setenv("SHIFT_DETECT_TIMEOUT", "18")
    since = time.time()
    patient = ("--timeout", "18")
    h0, h1 = lab.namespace("h0"), lab.namespace("h1")
    assert h0 is not None and h1 is not None
    with Stream(lab, "send", sender_args=patient, receiver_args=patient) as stream:
        bulk = threading.Thread(
            target=tcp_rate, args=(h0, h1, lab.shape.rail_address(0, 1), 6.0), daemon=True
        )
        bulk.start()
        time.sleep(2.0)  # the judge learns what the NIC carries
        with slow_port(lab, 0, "h1", SLOW, latency="5s"):  # a deep queue: nothing lost, only slow
            assert stream.sender.read("state", timeout=10)["state"] == "fallback"
            reasons = degraded_nics(lab)
        print(f"\nDEGRADED while the port ran at {SLOW / 1e6:g} Mbit/s: {reasons}")
        assert reasons == {"h0": "slow"}, reasons
        bulk.join(timeout=60)
        assert stream.sender.read("state", timeout=15)["state"] == "default"
        sent, received = stream.finish()
    assert_intact(sent, received)
    moves = switches(lab, "h0", since, wait_for=2)
    assert moves[0] == (
        "FAILOVER_KIND_FAILOVER",
        "mlx5_0",
        "mlx5_1",
        "nic_event",
    ), moves
    assert moves[1][0] == "FAILOVER_KIND_FAILBACK", moves
