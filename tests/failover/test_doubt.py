"""An error completion that may be the application's or the link's (rxe's LOC_QP_OP_ERR, detect.EITHER) on a
device that still looks usable is held in doubt: it surfaces after EITHER_GRACE unless the device fails
first, when the QP moves instead. Meanwhile the context's other QPs go on: nothing waits under its lock.

The tcp provider answers a bad lkey with LOC_PROT_ERR, never with the ambiguous status, so these tests make
that status the ambiguous one. One lab host, two NICs, its shiftd; the QPs of one context connected to each
other (as in test_cq_overflow.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from labs import on_lab_host, running_lab
from stream_harness import fail_nic, recover_nic
from waiting import wait_until

from libshift.shift import ShiftContext, ShiftCQ, ShiftMR, ShiftPD, ShiftQP, State, detect
from libshift.shift.paths import BACKUP, PRIMARY
from libshift.verbs import SGE, WC, QPAttr, QPInitAttr, RecvWR, SendWR
from libshift.verbs import enums as e
from shiftlab.lab import Lab

pytestmark = [pytest.mark.lab, pytest.mark.timeout(120)]

ACCESS = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
BAD_LKEY = e.IBV_WC_LOC_PROT_ERR  # the tcp provider's answer, standing in for rxe's ambiguous one


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with running_lab("db", hosts=1, nics=2) as lab:
        yield lab


@pytest.fixture
def ctx(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> Iterator[ShiftContext]:
    monkeypatch.setattr(detect, "EITHER", BAD_LKEY)
    with on_lab_host(lab), ShiftContext(name="mlx5_0") as ctx:
        assert ctx.resilient
        yield ctx


class Pair:
    """Two QPs of `ctx` connected to each other, each with its own CQ; `a` sends to `b`."""

    def __init__(self, ctx: ShiftContext) -> None:
        pd = ShiftPD(ctx)
        self.mr = ShiftMR(pd, 4096, ACCESS)
        self.a_cq, self.b_cq = ShiftCQ(ctx, 16), ShiftCQ(ctx, 16)
        self.a = ShiftQP(pd, QPInitAttr(scq=self.a_cq, rcq=self.a_cq))
        self.b = ShiftQP(pd, QPInitAttr(scq=self.b_cq, rcq=self.b_cq))
        self.a.connect(self.b.endpoint(), QPAttr(qp_access_flags=ACCESS))
        self.b.connect(self.a.endpoint(), QPAttr(qp_access_flags=ACCESS))
        assert self.a.state == State.DEFAULT

    def send(self, wr_id: int, lkey: int | None = None) -> None:
        key = self.mr.lkey if lkey is None else lkey
        self.a.post_send(SendWR(wr_id=wr_id, sg=[SGE(self.mr.buf, 8, key)]))

    def round_trip(self, wr_id: int) -> None:
        """One message from a to b, both completions taken."""
        self.b.post_recv(RecvWR(wr_id=wr_id, sg=[SGE(self.mr.buf + 64, 64, self.mr.lkey)]))
        self.send(wr_id)
        assert [(w.wr_id, w.status) for w in take(self.a_cq, 1)] == [(wr_id, e.IBV_WC_SUCCESS)]
        assert [(w.wr_id, w.status) for w in take(self.b_cq, 1)] == [(wr_id, e.IBV_WC_SUCCESS)]


def take(cq: ShiftCQ, count: int, timeout: float = 10.0) -> list[WC]:
    got: list[WC] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        got += cq.poll(count - len(got))[1]
    assert len(got) == count, f"{len(got)} of {count} completions in {timeout} s"
    return got


def test_the_applications_error_surfaces_after_the_grace_while_the_other_qps_go_on(ctx: ShiftContext) -> None:
    bad, other = Pair(ctx), Pair(ctx)
    bad.b.post_recv(RecvWR(wr_id=9, sg=[SGE(bad.mr.buf + 64, 64, bad.mr.lkey)]))
    started = time.monotonic()
    bad.send(1, lkey=bad.mr.lkey ^ 0x5A5A)
    bad.send(2)  # behind the error: flushed, and held with it
    assert wait_until(lambda: bad.a.doubt.on(PRIMARY), timeout=5)
    for wr_id in range(10, 20):  # the context is not held up by the doubt
        other.round_trip(wr_id)
    assert bad.a.doubt.on(PRIMARY) and bad.a_cq.poll(1)[0] == 0  # and all of it ran while in doubt

    got = take(bad.a_cq, 2)
    assert time.monotonic() - started >= detect.EITHER_GRACE
    assert [(w.wr_id, w.status) for w in got] == [(1, BAD_LKEY), (2, e.IBV_WC_WR_FLUSH_ERR)]
    assert bad.a.state == State.BROKEN and bad.a.doubt.path is None and not ctx.doubtful
    assert bad.a.current == PRIMARY  # it never moved: not for its error, nor for the flushes behind it
    assert other.a.state == State.DEFAULT


def test_a_device_that_fails_within_the_grace_moves_the_qp_and_what_it_held(
    lab: Lab, ctx: ShiftContext
) -> None:
    pair = Pair(ctx)
    for wr_id in (1, 2):
        pair.b.post_recv(RecvWR(wr_id=wr_id, sg=[SGE(pair.mr.buf + 64 * wr_id, 64, pair.mr.lkey)]))
    pair.send(1, lkey=pair.mr.lkey ^ 0x5A5A)
    pair.send(2)
    assert wait_until(lambda: pair.a.doubt.on(PRIMARY), timeout=5)
    try:
        fail_nic(lab, ["h0"], "mlx5_0")
        # replayed on the backup, where the lkey is as bad and there is nowhere left to go: it surfaces
        got = take(pair.a_cq, 2)
    finally:
        recover_nic(lab, ["h0"], ["mlx5_0"])
    assert [(w.wr_id, w.status) for w in got] == [(1, BAD_LKEY), (2, e.IBV_WC_WR_FLUSH_ERR)]
    assert pair.a.current == BACKUP and pair.a.state == State.BROKEN and not ctx.doubtful
