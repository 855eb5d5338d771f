"""A ShiftCQ overflows as the provider's CQ does: the same sequence of posts without polling gives the same
error, with a backup device or without one.

As in the conformance suite (tests/conformance/test_states.py): a CQ of 4 entries, 8 RDMA WRITEs on its QP,
no completion taken; the QP goes to ERR, poll raises CQOverflowError, for good. Each case runs the sequence
on the bare verbs objects and on their Shift twins, on the same devices, and compares what the application
sees. Without a backup: one device on the loopback and no shiftd (a plain ShiftContext). With one: a lab
host's two NICs and its shiftd, opened from this process.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from labs import on_lab_host, running_lab
from waiting import wait_until

from libshift.shift import ShiftCompChannel, ShiftContext, ShiftCQ, ShiftMR, ShiftPD, ShiftQP, State
from libshift.verbs import CQ, MR, PD, QP, CompChannel, Context, CQOverflowError, QPAttr, QPInitAttr, SendWR
from libshift.verbs import enums as e
from shiftlab.lab import Lab

pytestmark = [pytest.mark.lab, pytest.mark.timeout(120)]

ACCESS = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
CQE = 4
OVERFLOW = f"CQ overflow: more than {CQE} completions were not polled"


@dataclass(frozen=True)
class Kit:
    """The classes of one API: the provider's verbs objects, or their Shift twins."""

    context: Callable[..., Any]
    pd: Callable[..., Any]
    mr: Callable[..., Any]
    cq: Callable[..., Any]
    qp: Callable[..., Any]
    channel: Callable[..., Any]


BARE = Kit(Context, PD, MR, CQ, QP, CompChannel)
SHIFT = Kit(ShiftContext, ShiftPD, ShiftMR, ShiftCQ, ShiftQP, ShiftCompChannel)


class Ends:
    """Two QPs of one context connected to each other; `a`'s CQ has CQE entries (and a channel if `block`)."""

    def __init__(self, kit: Kit, device: str, block: bool = False) -> None:
        self.ctx = kit.context(name=device)
        pd = kit.pd(self.ctx)
        self.mr = kit.mr(pd, 64, ACCESS)
        self.channel = kit.channel(self.ctx) if block else None
        self.cq = kit.cq(self.ctx, CQE, channel=self.channel)
        other = kit.cq(self.ctx, CQE)
        self.a = kit.qp(pd, QPInitAttr(scq=self.cq, rcq=self.cq))
        self.b = kit.qp(pd, QPInitAttr(scq=other, rcq=other))
        self.a.connect(self.b.endpoint(), QPAttr(qp_access_flags=ACCESS))
        self.b.connect(self.a.endpoint(), QPAttr(qp_access_flags=ACCESS))

    def write(self, count: int) -> None:
        """`count` RDMA WRITEs (zero bytes) from `a` into b's MR."""
        for i in range(count):
            wr = SendWR(wr_id=i, opcode=e.IBV_WR_RDMA_WRITE, sg=[])
            wr.set_wr_rdma(self.mr.rkey, self.mr.buf)
            self.a.post_send(wr)

    def poll_error(self) -> str:
        with pytest.raises(CQOverflowError) as raised:
            self.cq.poll(1)
        return str(raised.value)


def first_error(cq: Any) -> str:
    """Poll for nothing (poll(0) takes no completion) until the CQ reports its overflow: a plain ShiftContext
    has no thread of its own, its QPs learn of their completions when the application polls."""
    deadline = time.monotonic() + 10
    while True:
        try:
            cq.poll(0)
        except CQOverflowError as exc:
            return str(exc)
        assert time.monotonic() < deadline, "the CQ never overflowed"
        time.sleep(0.01)


@pytest.fixture
def loopback(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """One device, on lo, and no shiftd: a ShiftContext on it has no backup."""
    monkeypatch.setenv("SHIFT_TCP_DEVICES", "il_lo=lo")
    monkeypatch.setenv("SHIFT_SOCKET", str(tmp_path / "no-shiftd.sock"))


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with running_lab("il", hosts=1, nics=2) as lab:
        yield lab


@pytest.fixture
def lab_host(lab: Lab) -> Iterator[None]:
    with on_lab_host(lab):
        yield


KITS = pytest.mark.parametrize("kit", [BARE, SHIFT], ids=["bare", "shift"])


@KITS
def test_without_a_backup(loopback: None, kit: Kit) -> None:
    ends = Ends(kit, "il_lo")
    try:
        assert getattr(ends.ctx, "resilient", False) is False
        ends.write(2 * CQE)
        assert first_error(ends.cq) == OVERFLOW
        assert ends.poll_error() == OVERFLOW  # for good
        assert ends.a.qp_state == e.IBV_QPS_ERR
    finally:
        ends.ctx.close()


@KITS
def test_with_a_backup(lab_host: None, kit: Kit) -> None:
    ends = Ends(kit, "mlx5_0")
    try:
        assert kit is BARE or (ends.ctx.resilient and ends.a.state == State.DEFAULT)
        ends.write(2 * CQE)
        assert wait_until(lambda: ends.a.qp_state == e.IBV_QPS_ERR, timeout=5)  # before any poll
        assert ends.poll_error() == OVERFLOW
        assert ends.poll_error() == OVERFLOW
    finally:
        ends.ctx.close()


@KITS
def test_a_waiter_on_an_armed_channel_wakes_to_meet_the_overflow(loopback: None, kit: Kit) -> None:
    ends = Ends(kit, "il_lo", block=True)
    try:
        ends.write(2 * CQE)
        assert wait_until(lambda: ends.a.qp_state == e.IBV_QPS_ERR, timeout=5)  # (shift: its watcher saw it)
        ends.cq.req_notify()
        ends.write(1)  # flushed at once, in ERR: its completion is lost too, and tells the armed channel
        assert ends.channel.get_cq_event(timeout=5) is ends.cq
        assert ends.poll_error() == OVERFLOW
    finally:
        ends.ctx.close()
