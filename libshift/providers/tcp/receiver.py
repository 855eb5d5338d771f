"""The responder half of a QP: the receive queue, and the checks and placement of incoming requests.

Requests are executed in order: one whose sequence number is not the expected one is dropped unread (after
an RNR NAK the requester goes back and sends again). Every remote access is checked against the rkey, the
bounds, the MR's and the QP's access flags before a byte is placed; a violation is NAK'd with
REM_ACCESS_ERR, nothing is written, and the QP goes to ERR, as on an RNIC.
"""

from __future__ import annotations

import errno
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from libshift.providers.tcp import wire
from libshift.providers.tcp.sender import ATOMIC_VALUE
from libshift.vocabulary.enums import ibv_access_flags, ibv_wc_flags, ibv_wc_opcode, ibv_wc_status
from libshift.vocabulary.errors import VerbsRDMAError
from libshift.vocabulary.wr import WC, RecvWR

if TYPE_CHECKING:
    from libshift.providers.tcp.qp import TcpQP

Op = wire.Op
ACCESS = ibv_access_flags
STATUS = ibv_wc_status
NEEDS_RECV = frozenset({Op.SEND, Op.SEND_IMM, Op.WRITE_IMM})
SENDS = frozenset({Op.SEND, Op.SEND_IMM})
NEEDED_ACCESS = {  # plain ints: IntFlag arithmetic is slow, and this is checked for every request
    Op.WRITE: int(ACCESS.IBV_ACCESS_REMOTE_WRITE),
    Op.WRITE_IMM: int(ACCESS.IBV_ACCESS_REMOTE_WRITE),
    Op.READ_REQ: int(ACCESS.IBV_ACCESS_REMOTE_READ),
    Op.CMP_SWP: int(ACCESS.IBV_ACCESS_REMOTE_ATOMIC),
    Op.FETCH_ADD: int(ACCESS.IBV_ACCESS_REMOTE_ATOMIC),
}
MASK64 = (1 << 64) - 1
WITH_IMM = frozenset({Op.SEND_IMM, Op.WRITE_IMM})
# looked up once, not for every message
SUCCESS = STATUS.IBV_WC_SUCCESS
RECV, RECV_RDMA_WITH_IMM = ibv_wc_opcode.IBV_WC_RECV, ibv_wc_opcode.IBV_WC_RECV_RDMA_WITH_IMM
WC_WITH_IMM = ibv_wc_flags.IBV_WC_WITH_IMM


@dataclass(slots=True)
class PostedRecv:
    wr_id: int
    buffers: list[memoryview] | None  # None: an SGE named memory this QP may not write
    capacity: int


class Responder:
    def __init__(self, qp: TcpQP) -> None:
        self.qp = qp
        self.rq: deque[PostedRecv] = deque()
        self.expected = 0
        self.ack_seq: int | None = None  # executed but not yet acknowledged
        self.unacked = 0
        self._accepted = False  # whether the frame being read is to be executed

    def start(self, psn: int) -> None:
        self.expected = psn & wire.SEQ_MASK

    def post(self, wr: RecvWR) -> None:
        qp, rq = self.qp, self.rq
        cap = qp.cap
        if len(rq) >= cap.max_recv_wr:
            raise VerbsRDMAError(f"QP {qp.qp_num}: receive queue full ({cap.max_recv_wr} WRs)", errno.ENOMEM)
        sges = wr.sges()
        if len(sges) > cap.max_recv_sge:
            raise VerbsRDMAError(f"QP {qp.qp_num}: {len(sges)} SGEs, max_recv_sge is {cap.max_recv_sge}")
        local = qp.pd.local
        buffers: list[memoryview] | None = []
        capacity = 0
        for sge in sges:  # one loop, not three comprehensions: this runs for every message
            capacity += sge.length
            view = local(sge.lkey, sge.addr, sge.length, True)
            if view is None:
                buffers = None
            elif buffers is not None:
                buffers.append(view)
        rq.append(PostedRecv(wr.wr_id, buffers, capacity))

    def pop_all(self) -> list[PostedRecv]:
        items = list(self.rq)
        self.rq.clear()
        self.take_ack()
        return items

    # -- requests in --------------------------------------------------------------------------------------

    def on_request(self, hdr: wire.Header) -> list[memoryview] | None:
        """Check a request and say where its payload goes; None drops the payload."""
        self._accepted = False
        if hdr.seq != self.expected:
            return None
        op = hdr.op
        if op in NEEDED_ACCESS:
            target = self._remote(hdr, op)
            if target is None:
                return self._nak(hdr, STATUS.IBV_WC_REM_ACCESS_ERR)
        if op in NEEDS_RECV and not self.rq:
            self.qp.send_response(wire.pack(Op.NAK, hdr.seq, imm=wire.NAK_RNR, arg1=self.qp.min_rnr_timer))
            return None
        if op in SENDS:
            recv = self.rq[0]
            if recv.buffers is None:
                return self._fail_recv(hdr, STATUS.IBV_WC_LOC_PROT_ERR, STATUS.IBV_WC_REM_OP_ERR)
            if hdr.length > recv.capacity:
                return self._fail_recv(hdr, STATUS.IBV_WC_LOC_LEN_ERR, STATUS.IBV_WC_REM_INV_REQ_ERR)
            self._accepted = True
            return _cut(recv.buffers, hdr.length)
        self._accepted = True
        return [target] if op in (Op.WRITE, Op.WRITE_IMM) else None

    def on_request_done(self, hdr: wire.Header, placed: bool) -> None:
        """Act on a request whose payload has been placed (or, when not placed, was dropped)."""
        if not self._accepted or self.qp.in_error:
            return  # refused in on_request (NAK sent), or dropped while waiting for a retry
        self._accepted = False
        op = hdr.op
        if op in wire.CARRIES_PAYLOAD and not placed:
            return
        if op == Op.READ_REQ:
            data = self._remote(hdr, op)
            self.qp.send_response(wire.pack(Op.READ_RESP, hdr.seq, hdr.length), data)
        elif op in (Op.CMP_SWP, Op.FETCH_ADD):
            self.qp.send_response(wire.pack(Op.ATOMIC_RESP, hdr.seq, arg1=self._atomic(hdr, op)))
        else:
            self.ack_seq = hdr.seq
            self.unacked += 1
        if op in NEEDS_RECV:
            self._complete_recv(hdr, op)
        self.expected = (self.expected + 1) & wire.SEQ_MASK

    def take_ack(self) -> int | None:
        """The sequence number to acknowledge (acks are cumulative), once."""
        seq, self.ack_seq, self.unacked = self.ack_seq, None, 0
        return seq

    # -- helpers ------------------------------------------------------------------------------------------

    def _remote(self, hdr: wire.Header, op: int) -> memoryview | None:
        access = NEEDED_ACCESS[op]
        if not self.qp.access & access:
            return None
        length = 8 if op in (Op.CMP_SWP, Op.FETCH_ADD) else hdr.length
        if length == 8 and op in (Op.CMP_SWP, Op.FETCH_ADD) and hdr.addr % 8:
            return None
        return self.qp.pd.remote(hdr.rkey, hdr.addr, length, access)

    def _atomic(self, hdr: wire.Header, op: int) -> int:
        target = self._remote(hdr, op)
        assert target is not None  # checked in on_request, and nothing runs in between on this thread
        (old,) = ATOMIC_VALUE.unpack(target)
        if op == Op.FETCH_ADD:
            ATOMIC_VALUE.pack_into(target, 0, (old + hdr.arg1) & MASK64)
        elif old == hdr.arg1:
            ATOMIC_VALUE.pack_into(target, 0, hdr.arg2)
        return old

    def _complete_recv(self, hdr: wire.Header, op: int) -> None:
        recv = self.rq.popleft()
        with_imm = op in WITH_IMM
        qp = self.qp
        wc = WC(  # positional, in WC's field order: keywords cost a microsecond per message
            recv.wr_id,
            SUCCESS,
            RECV_RDMA_WITH_IMM if op == Op.WRITE_IMM else RECV,
            qp.qp_num,
            hdr.length,
            hdr.imm if with_imm else 0,
            WC_WITH_IMM if with_imm else 0,
            qp.remote_qpn,
        )
        qp.complete_recv(wc, hdr.flags & wire.FLAG_SOLICITED != 0)

    def _nak(self, hdr: wire.Header, status: ibv_wc_status) -> None:
        self.qp.send_response(wire.pack(Op.NAK, hdr.seq, imm=status))
        self.qp.enter_error()

    def _fail_recv(self, hdr: wire.Header, local: ibv_wc_status, remote: ibv_wc_status) -> None:
        recv = self.rq.popleft()
        wc = WC(wr_id=recv.wr_id, status=local, opcode=ibv_wc_opcode.IBV_WC_RECV, qp_num=self.qp.qp_num)
        self.qp.complete_recv(wc, solicited=False)
        self._nak(hdr, remote)

    def flush_wc(self, recv: PostedRecv) -> WC:
        return WC(
            wr_id=recv.wr_id,
            status=STATUS.IBV_WC_WR_FLUSH_ERR,
            opcode=ibv_wc_opcode.IBV_WC_RECV,
            qp_num=self.qp.qp_num,
        )


def _cut(buffers: list[memoryview], length: int) -> list[memoryview]:
    """The scatter list trimmed to exactly `length` bytes."""
    if len(buffers) == 1:
        return [buffers[0][:length]]
    out = []
    for view in buffers:
        if length <= 0:
            break
        out.append(view[:length])
        length -= len(out[-1])
    return out
