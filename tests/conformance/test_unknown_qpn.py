"""A send towards a QPN nobody has fails with RETRY_EXC_ERR, on every provider: an RNIC drops the packets
and runs out of retries, the tcp provider hears the peer's listener refuse (docs/wire.md) and says so at
once. Either way the application sees an error, not a hang."""

from __future__ import annotations

import time

from libshift.verbs import CQ, MR, PD, QP, SGE, QPAttr, QPInitAttr, SendWR
from libshift.verbs import enums as e


def test_a_send_to_a_destroyed_qp_completes_retry_exc_err(contexts):
    ours, theirs = contexts
    pd = PD(ours)
    cq = CQ(ours, 4)
    mr = MR(pd, 64, e.ALL_ACCESS)
    qp = QP(pd, QPInitAttr(scq=cq, rcq=cq))
    peer_cq = CQ(theirs, 4)
    gone = QP(PD(theirs), QPInitAttr(scq=peer_cq, rcq=peer_cq))
    dest = gone.endpoint()
    gone.close()
    try:
        qp.connect(dest, QPAttr(qp_access_flags=e.ALL_ACCESS, timeout=12, retry_cnt=2))
        qp.post_send(SendWR(wr_id=1, opcode=e.IBV_WR_SEND, sg=[SGE(mr.buf, 8, mr.lkey)]))
        deadline = time.monotonic() + 60
        wcs: list = []
        while not wcs and time.monotonic() < deadline:
            wcs = cq.poll()[1]
            time.sleep(0.005)
        assert [(w.wr_id, w.status) for w in wcs] == [(1, e.IBV_WC_RETRY_EXC_ERR)]
    finally:
        qp.close()
        mr.close()
