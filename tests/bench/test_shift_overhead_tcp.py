"""What the tcp provider does so that many QPs, and the shift layer above it, cost little.

Connections read into the core's one staging buffer per context, so an idle connection holds none (a
thousand backup connections held 64 MiB when each had its own), and the shared buffer never mixes the frames
of interleaved connections; a wait on a completion channel can be cut short by wake() (the shift layer makes
a completion on another thread and must end its application thread's wait).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import pytest
from veth_contexts import veth_contexts

from libshift.verbs import (
    CQ,
    MR,
    PD,
    QP,
    SGE,
    CompChannel,
    Context,
    QPAttr,
    QPCap,
    QPInitAttr,
    RecvWR,
    SendWR,
)
from libshift.verbs import enums as e

pytestmark = pytest.mark.lab

ALL = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
SIZES = (8, 300, 5000, 20000, 70000)  # below and above the staging buffer and the direct-placement size
PAIRS = 12


@pytest.fixture(scope="module")
def contexts() -> Iterator[tuple[Context, Context]]:
    with veth_contexts("ovt", "198.18.77") as (_, a, b):
        yield a, b


def poll_all(cq: CQ, count: int, timeout: float = 10.0) -> list:
    """`count` completions of cq, busy polling (yielding the interpreter) for at most `timeout` s."""
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        wcs = cq.poll(count - len(got))[1]
        got.extend(wcs)
        if not wcs:
            time.sleep(0)
    return got


def test_interleaved_connections_share_one_staging_buffer_without_mixing_frames(contexts) -> None:
    ctx_a, ctx_b = contexts
    pd_a, pd_b = PD(ctx_a), PD(ctx_b)
    cq_a, cq_b = CQ(ctx_a, 1024), CQ(ctx_b, 1024)
    room = sum(SIZES)
    mr_a, mr_b = MR(pd_a, room * PAIRS, ALL), MR(pd_b, room * PAIRS, ALL)
    cap = QPCap(max_send_wr=16, max_recv_wr=16)
    qps = []
    for _ in range(PAIRS):
        a, b = (QP(pd, QPInitAttr(scq=cq, rcq=cq, cap=cap)) for pd, cq in ((pd_a, cq_a), (pd_b, cq_b)))
        a.connect(b.endpoint(), QPAttr(qp_access_flags=ALL))
        b.connect(a.endpoint(), QPAttr(qp_access_flags=ALL))
        qps.append((a, b))
    try:
        expected = bytearray(os.urandom(room * PAIRS))
        mr_a.write(bytes(expected))
        for i, (a, b) in enumerate(qps):  # every QP sends every size at once: the frames interleave
            offset = i * room
            for size in SIZES:
                b.post_recv(RecvWR(wr_id=offset, sg=[SGE(mr_b.buf + offset, size, mr_b.lkey)]))
                a.post_send(
                    SendWR(wr_id=offset, opcode=e.IBV_WR_SEND, sg=[SGE(mr_a.buf + offset, size, mr_a.lkey)])
                )
                offset += size
        received = poll_all(cq_b, PAIRS * len(SIZES))
        sent = poll_all(cq_a, PAIRS * len(SIZES))
        assert [wc.status for wc in received + sent] == [e.IBV_WC_SUCCESS] * (2 * PAIRS * len(SIZES))
        assert mr_b.read(room * PAIRS) == bytes(expected)
    finally:
        for qp in (qp for pair in qps for qp in pair):
            qp.close()
        for obj in (mr_a, mr_b, cq_a, cq_b, pd_a, pd_b):
            obj.close()


def test_wake_cuts_a_channel_wait_short(contexts) -> None:
    ctx_a, _ = contexts
    channel = CompChannel(ctx_a)
    CQ(ctx_a, 4, channel=channel).req_notify()
    threading.Timer(0.2, channel.impl.wake).start()
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        channel.get_cq_event(timeout=30)
    assert time.monotonic() - started < 10  # ended by the wake, not by the 30 s timeout
    channel.impl.wake()  # with nobody waiting, the next wait ends at once
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        channel.get_cq_event(timeout=30)
    assert time.monotonic() - started < 10
    channel.close()
