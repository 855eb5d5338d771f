"""One end of a SEND stream over the shift layer: a ShiftContext on a device with its PD, MR (one slot of
`size` bytes per message), CQ and QP, for the tests that stream across a failover on Soft-RoCE."""

from __future__ import annotations

import time

from libshift.agent import Agent
from libshift.shift import ShiftContext, ShiftCQ, ShiftMR, ShiftPD, ShiftQP
from libshift.verbs import SGE, QPCap, QPInitAttr, SendWR
from libshift.verbs import enums as e


class StreamEnd:
    def __init__(self, device: str, agent: Agent, count: int, size: int, window: int, access: int) -> None:
        self.size, self.window = size, window
        self.agent = agent  # the caller's to close
        self.ctx = ShiftContext(device, agent=agent)
        assert self.ctx.resilient, f"{device}: no failover"
        self.pd = ShiftPD(self.ctx)
        self.mr = ShiftMR(self.pd, count * size, access)
        self.cq = ShiftCQ(self.ctx, 2 * count)
        cap = QPCap(max_send_wr=window, max_recv_wr=count)
        self.qp = ShiftQP(self.pd, QPInitAttr(scq=self.cq, rcq=self.cq, cap=cap))

    def sge(self, seq: int) -> SGE:
        return SGE(self.mr.buf + seq * self.size, self.size, self.mr.lkey)

    def close(self) -> None:
        for obj in (self.qp, self.mr, self.cq, self.pd, self.ctx):
            obj.close()


def stream(sender: StreamEnd, receiver: StreamEnd, first: int, end: int, deadline_s: float) -> list[int]:
    """SENDs first..end-1 from sender to receiver; the wr_ids received, in order, and no failed completion."""
    sent, done, received, failed = first, first, [], []
    deadline = time.monotonic() + deadline_s
    while len(received) < end - first and time.monotonic() < deadline:
        while sent < end and sent - done < sender.window:
            sge = sender.sge(sent)
            sender.qp.post_send(
                SendWR(wr_id=sent, opcode=e.IBV_WR_SEND, sg=[sge], send_flags=e.IBV_SEND_SIGNALED)
            )
            sent += 1
        for side, seen in ((sender, None), (receiver, received)):
            for wc in side.cq.poll(sender.window)[1]:
                if wc.status != e.IBV_WC_SUCCESS:
                    failed.append(f"{side.ctx.name} wr {wc.wr_id}: {e.ibv_wc_status(wc.status).name}")
                elif seen is None:
                    done += 1
                else:
                    seen.append(wc.wr_id)
        time.sleep(0.001)
    assert failed == []
    return received
