"""A short ping-pong over the C core, for valgrind (tests/core/test_core_valgrind.py): SENDs both ways, a
WRITE, a READ, an atomic, then a remote access error and the flush after it, then everything closed. Run with
SHIFT_TCP_DEVICES=vg_lo=lo; exits non-zero if a completion is not the one expected."""

from __future__ import annotations

import time

from libshift.verbs import CQ, MR, PD, QP, SGE, WC, Context, QPAttr, QPInitAttr, RecvWR, SendWR
from libshift.verbs import enums as e

ROUNDS = 50


def wait(cq: CQ, timeout: float = 30.0) -> WC:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, wcs = cq.poll(1)
        if wcs:
            return wcs[0]
    raise SystemExit("no completion")


def expect(wc: WC, status: int = e.IBV_WC_SUCCESS) -> None:
    if wc.status != status:
        raise SystemExit(f"completion {wc.wr_id}: {wc.status}, not {status}")


def main() -> None:
    ctx = Context(name="vg_lo")
    pd = PD(ctx)
    ends = []
    for _ in range(2):
        cq = CQ(ctx, 64)
        ends.append((cq, QP(pd, QPInitAttr(scq=cq, rcq=cq)), MR(pd, 4096, e.ALL_ACCESS)))
    (cq_a, a, mr_a), (_, b, mr_b) = ends
    for qp, peer in ((a, b), (b, a)):
        qp.to_init(QPAttr(qp_access_flags=e.ALL_ACCESS))
        qp.to_rtr(QPAttr(dest=peer.endpoint()))
        qp.to_rts(QPAttr())
    for i in range(ROUNDS):  # ping a -> b, pong b -> a
        for (cq_s, s, mr_s), (cq_r, r, mr_r) in ((ends[0], ends[1]), (ends[1], ends[0])):
            r.post_recv(RecvWR(wr_id=i, sg=[SGE(mr_r.buf, 64, mr_r.lkey)]))
            mr_s.write(i.to_bytes(8, "little"))
            s.post_send(SendWR(wr_id=i, opcode=e.IBV_WR_SEND, sg=[SGE(mr_s.buf, 8, mr_s.lkey)]))
            expect(wait(cq_s))
            expect(wait(cq_r))
            if mr_r.read(8) != i.to_bytes(8, "little"):
                raise SystemExit(f"round {i}: wrong bytes")
    one = SGE(mr_a.buf, 8, mr_a.lkey)
    for opcode in (e.IBV_WR_RDMA_WRITE, e.IBV_WR_RDMA_READ, e.IBV_WR_ATOMIC_FETCH_AND_ADD):
        wr = SendWR(wr_id=opcode, opcode=opcode, sg=[one], remote_addr=mr_b.buf + 8, rkey=mr_b.rkey)
        if opcode == e.IBV_WR_ATOMIC_FETCH_AND_ADD:
            wr.compare_add = 1
        a.post_send(wr)
        expect(wait(cq_a))
    bad = SendWR(wr_id=99, opcode=e.IBV_WR_RDMA_WRITE, sg=[one], remote_addr=mr_b.buf + 4090, rkey=mr_b.rkey)
    a.post_send(bad)  # past the MR's end: REM_ACCESS_ERR, then a flush of what follows
    a.post_send(SendWR(wr_id=100, opcode=e.IBV_WR_SEND, sg=[one]))
    expect(wait(cq_a), e.IBV_WC_REM_ACCESS_ERR)
    expect(wait(cq_a), e.IBV_WC_WR_FLUSH_ERR)
    for _, qp, mr in ends:
        qp.close()
        mr.close()
    ctx.close()
    print("ok")


if __name__ == "__main__":
    main()
