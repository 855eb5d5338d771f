"""The tcp provider's CQs as the suites above the provider rely on them."""

from __future__ import annotations

import time

import pytest

from libshift.verbs import CQ, MR, PD, QP, Context, CQOverflowError, QPAttr, QPInitAttr, SendWR
from libshift.verbs import enums as e

CQE = 4


def test_poll_of_zero_entries_reports_an_overflow(lo_context: Context) -> None:
    """poll(0) takes no completion but still makes progress and raises once the CQ has overflowed (the
    failover suite waits for the overflow that way)."""
    pd = PD(lo_context)
    mr = MR(pd, 64, e.ALL_ACCESS)
    cq, other = CQ(lo_context, CQE), CQ(lo_context, CQE)
    a, b = QP(pd, QPInitAttr(scq=cq, rcq=cq)), QP(pd, QPInitAttr(scq=other, rcq=other))
    for qp, peer in ((a, b), (b, a)):
        qp.to_init(QPAttr(qp_access_flags=e.ALL_ACCESS))
        qp.to_rtr(QPAttr(dest=peer.endpoint()))
        qp.to_rts(QPAttr())
    for i in range(2 * CQE):
        a.post_send(SendWR(wr_id=i, opcode=e.IBV_WR_RDMA_WRITE, sg=[], remote_addr=mr.buf, rkey=mr.rkey))
    deadline = time.monotonic() + 10
    with pytest.raises(CQOverflowError):
        while time.monotonic() < deadline:
            cq.poll(0)
            time.sleep(0.01)
    with pytest.raises(CQOverflowError):
        cq.poll(0)  # for good
