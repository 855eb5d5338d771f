"""Many QPs on one CQ whose default path fails at once: each switches on its own error, one after the other.

One lab host with two NICs and its shiftd; this process opens the host's devices and one ShiftContext with
PAIRS pairs of QPs connected to each other, every QP on the one CQ. Each `a` QP has a receive posted; its
default provider QP is put in ERR, all at once, so PAIRS flush errors wait in the CQ together, as when a
thousand QPs meet their ack deadline while the NIC event is still moving the first of them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from labs import on_lab_host, running_lab
from stream_harness import wait_all_up
from waiting import wait_until

from libshift.shift import ShiftContext, ShiftCQ, ShiftMR, ShiftPD, ShiftQP, State
from libshift.shift.paths import PRIMARY
from libshift.verbs import SGE, QPAttr, QPCap, QPInitAttr, RecvWR, SendWR
from libshift.verbs import enums as e
from shiftlab.lab import Lab

pytestmark = [pytest.mark.lab, pytest.mark.timeout(180)]

PAIRS = 250  # past Python's recursion limit when each switch started the next one's inside its own
ACCESS = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with running_lab("mq", hosts=1, nics=2) as lab:
        yield lab


def test_a_cq_full_of_errors_switches_its_qps_one_after_the_other(lab: Lab) -> None:
    """Every `a` QP moves to the backup for its own error completion (none inside another's switch: the
    drain of a switch acts on its own QP's completions only), and every pair then carries a message."""
    wait_all_up(lab)
    with on_lab_host(lab):
        ctx = ShiftContext(name="mlx5_0")
        try:
            pd = ShiftPD(ctx)
            mr = ShiftMR(pd, 2 * PAIRS * 8, ACCESS)
            cq = ShiftCQ(ctx, 8 * PAIRS)
            init = QPInitAttr(scq=cq, rcq=cq, cap=QPCap(max_send_wr=4, max_recv_wr=4))
            pairs = [(ShiftQP(pd, init), ShiftQP(pd, init)) for _ in range(PAIRS)]
            for a, b in pairs:
                a.connect(b.endpoint(), QPAttr(qp_access_flags=ACCESS))
                b.connect(a.endpoint(), QPAttr(qp_access_flags=ACCESS))
            for i, (a, _) in enumerate(pairs):
                a.post_recv(RecvWR(wr_id=i, sg=[SGE(mr.buf + 8 * i, 8, mr.lkey)]))
            assert all(a.state == State.DEFAULT for a, _ in pairs)
            for a, _ in pairs:
                a.qps[PRIMARY].to_err()  # its receive flushes: the transport's error, a failover
            assert wait_until(
                lambda: cq.poll(0) == (0, []) and all(a.state == State.FALLBACK for a, _ in pairs)
            )
            for i, (_, b) in enumerate(pairs):  # each a's receive, moved to the backup, takes b's message
                b.post_send(SendWR(wr_id=i, sg=[SGE(mr.buf + 8 * (PAIRS + i), 8, mr.lkey)],
                                   send_flags=e.IBV_SEND_SIGNALED))  # fmt: skip
            got: list = []
            wait_until(lambda: got.extend(cq.poll(64)[1]) or len(got) >= 2 * PAIRS, timeout=30)
            assert sorted((wc.qp_num, wc.wr_id, wc.status) for wc in got) == sorted(
                [(a.qp_num, i, e.IBV_WC_SUCCESS) for i, (a, _) in enumerate(pairs)]
                + [(b.qp_num, i, e.IBV_WC_SUCCESS) for i, (_, b) in enumerate(pairs)]
            )
        finally:
            ctx.close()
