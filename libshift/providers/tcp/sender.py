"""The requester half of a QP: the send queue, its frames, acks, the ack deadline and RNR retries.

Work requests complete in order, and only when the responder has answered for them (an ACK at or after
their sequence number, or their READ/atomic response). The ack deadline (4.096 us x 2**timeout per try,
retry_cnt + 1 tries) runs while anything is outstanding and restarts on every step of progress, and on
every sign of life TCP gives of the path (see liveness.py); when it passes, the oldest request completes
RETRY_EXC_ERR and the QP goes to ERR, which is how a dead or black-holed link looks on an RNIC.
"""

from __future__ import annotations

import errno
import struct
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from libshift.providers.tcp import wire
from libshift.providers.tcp.liveness import PathWatch
from libshift.vocabulary.attrs import ack_deadline, retry_period
from libshift.vocabulary.enums import ibv_send_flags, ibv_wc_opcode, ibv_wc_status, ibv_wr_opcode
from libshift.vocabulary.errors import VerbsRDMAError
from libshift.vocabulary.wr import WC, SendWR

if TYPE_CHECKING:
    from libshift.providers.tcp.qp import TcpQP

WR = ibv_wr_opcode
ATOMICS = frozenset({WR.IBV_WR_ATOMIC_CMP_AND_SWP, WR.IBV_WR_ATOMIC_FETCH_AND_ADD})
WRITES_LOCAL = ATOMICS | {WR.IBV_WR_RDMA_READ}  # results land in local memory
WIRE_OP = {
    WR.IBV_WR_SEND: wire.Op.SEND,
    WR.IBV_WR_SEND_WITH_IMM: wire.Op.SEND_IMM,
    WR.IBV_WR_RDMA_WRITE: wire.Op.WRITE,
    WR.IBV_WR_RDMA_WRITE_WITH_IMM: wire.Op.WRITE_IMM,
    WR.IBV_WR_RDMA_READ: wire.Op.READ_REQ,
    WR.IBV_WR_ATOMIC_CMP_AND_SWP: wire.Op.CMP_SWP,
    WR.IBV_WR_ATOMIC_FETCH_AND_ADD: wire.Op.FETCH_ADD,
}
WC_OP = {
    WR.IBV_WR_SEND: ibv_wc_opcode.IBV_WC_SEND,
    WR.IBV_WR_SEND_WITH_IMM: ibv_wc_opcode.IBV_WC_SEND,
    WR.IBV_WR_RDMA_WRITE: ibv_wc_opcode.IBV_WC_RDMA_WRITE,
    WR.IBV_WR_RDMA_WRITE_WITH_IMM: ibv_wc_opcode.IBV_WC_RDMA_WRITE,
    WR.IBV_WR_RDMA_READ: ibv_wc_opcode.IBV_WC_RDMA_READ,
    WR.IBV_WR_ATOMIC_CMP_AND_SWP: ibv_wc_opcode.IBV_WC_COMP_SWAP,
    WR.IBV_WR_ATOMIC_FETCH_AND_ADD: ibv_wc_opcode.IBV_WC_FETCH_ADD,
}
ATOMIC_VALUE = struct.Struct("=Q")
# IB's encoded RNR NAK timer (C9-138), in milliseconds; 0 is the longest.
RNR_DELAY_MS = (
    655.36, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12, 0.16, 0.24, 0.32, 0.48, 0.64, 0.96, 1.28, 1.92,
    2.56, 3.84, 5.12, 7.68, 10.24, 15.36, 20.48, 30.72, 40.96, 61.44, 81.92, 122.88, 163.84, 245.76,
    327.68, 491.52,
)  # fmt: skip
RNR_FOREVER = 7
# plain ints: IntFlag arithmetic costs microseconds, and these are tested on every post
INLINE = int(ibv_send_flags.IBV_SEND_INLINE)
SIGNALED = int(ibv_send_flags.IBV_SEND_SIGNALED)
SOLICITED = int(ibv_send_flags.IBV_SEND_SOLICITED)


@dataclass(slots=True)
class Outstanding:
    """A posted send WR until it completes; `local` are its resolved local buffers (or inline bytes).

    What goes on the wire is taken from the WR when it is posted, as ibv_post_send copies the WR: the
    application may reuse its SendWR at once. `fields` are the header's rkey, imm, addr, arg1 and arg2, in
    wire order (a tuple, not a dict: it is built and unpacked for every message).
    """

    wr_id: int
    opcode: ibv_wr_opcode
    seq: int
    signaled: bool
    local: list[memoryview] | bytes
    length: int
    fields: tuple[int, int, int, int, int]
    flags: int = 0
    error: ibv_wc_status | None = None
    rnr_tries: int = 0


class Requester:
    def __init__(self, qp: TcpQP) -> None:
        self.qp = qp
        self.sq: deque[Outstanding] = deque()
        self.next_seq = 0
        self.tx_seq = 0
        self.rnr_wait = False
        self.deadline: float | None = (
            None  # the ack deadline; the engine's timer may fire earlier, never later
        )
        self.ack_timeout = ack_deadline(qp.timeout, qp.retry_cnt)  # seconds; kept in step by configure()
        self.retry_period = retry_period(qp.timeout)  # one try of it: how often the timer looks at the path
        self._look = 0.0  # when the deadline's timer next looks at the path (once per retry period)
        self._path = PathWatch()
        self._timer_armed = False
        self._rnr_timer = object()

    def start(self, psn: int) -> None:
        self.next_seq = self.tx_seq = psn

    def configure(self, timeout: int, retry_cnt: int) -> None:
        """Take the QP's attributes for the ack deadline (worked out here once, not on every post)."""
        self.ack_timeout = ack_deadline(timeout, retry_cnt)
        self.retry_period = retry_period(timeout)

    # -- posting ------------------------------------------------------------------------------------------

    def post(self, wr: SendWR) -> None:
        """Check and copy the WR into the send queue (the engine lock is held); sending is the caller's."""
        qp, sq = self.qp, self.sq
        cap = qp.cap
        if len(sq) >= cap.max_send_wr:
            raise VerbsRDMAError(f"QP {qp.qp_num}: send queue full ({cap.max_send_wr} WRs)", errno.ENOMEM)
        op = wr.opcode
        if op not in WIRE_OP:
            raise VerbsRDMAError(f"QP {qp.qp_num}: unknown send opcode {op}")
        flags = int(wr.send_flags)
        sges = wr.sges()
        if len(sges) > cap.max_send_sge:
            raise VerbsRDMAError(f"QP {qp.qp_num}: {len(sges)} SGEs, max_send_sge is {cap.max_send_sge}")
        writes_local = op in WRITES_LOCAL
        local = qp.pd.local
        views: list[memoryview] = []
        length, denied = 0, False
        for sge in sges:  # one loop, not three comprehensions: this runs for every message
            length += sge.length
            view = local(sge.lkey, sge.addr, sge.length, writes_local)
            if view is None:
                denied = True
            else:
                views.append(view)
        if flags & INLINE and not writes_local:
            if length > cap.max_inline_data:
                limit = cap.max_inline_data
                raise VerbsRDMAError(f"QP {qp.qp_num}: {length} B inline, max_inline_data is {limit}")
            local_data: list[memoryview] | bytes = b"".join(views)
        else:
            local_data = views
        if op in ATOMICS and (len(sges) != 1 or length != 8):
            raise VerbsRDMAError(f"QP {qp.qp_num}: an atomic needs one SGE of 8 bytes")
        sq.append(
            Outstanding(
                wr.wr_id,
                op,
                self.next_seq,
                qp.sq_sig_all or bool(flags & SIGNALED),
                local_data,
                length,
                (wr.rkey, wr.imm_data, wr.remote_addr, wr.compare_add, wr.swap),
                wire.FLAG_SOLICITED if flags & SOLICITED else 0,
                ibv_wc_status.IBV_WC_LOC_PROT_ERR if denied else None,
            )
        )
        self.next_seq += 1

    @property
    def unsent(self) -> bool:
        """Whether a posted request waits to go on the wire (and may go now: no RNR wait under way)."""
        return self.tx_seq != self.next_seq and not self.rnr_wait

    def after_post(self) -> None:
        """Start the ack deadline unless it runs already; called after the new request went out, so that
        this bookkeeping is not between the application's post and the wire."""
        if self.deadline is None:
            self._arm()

    # -- frames out ---------------------------------------------------------------------------------------

    def next_request(self, ack: int | None) -> list[bytes | memoryview] | None:
        """The next request frame, carrying `ack` (the responder's pending cumulative ack) if not None."""
        if self.tx_seq == self.next_seq or self.rnr_wait:
            return None
        sq = self.sq
        item = sq[self.tx_seq - sq[0].seq]
        if item.error is not None:
            self.qp.fail(item, item.error)
            return None
        self.tx_seq += 1
        op = WIRE_OP[item.opcode]
        flags = item.flags if ack is None else item.flags | wire.FLAG_ACK
        header = wire.pack_request(op, flags, item.seq, item.length, item.fields, ack or 0)
        if op in wire.CARRIES_PAYLOAD:
            local = item.local
            return [header, local] if isinstance(local, bytes) else [header, *local]
        return [header]

    # -- responses in -------------------------------------------------------------------------------------

    def _outstanding(self, wire_seq: int) -> int | None:
        """The internal sequence number a response names, if it names a request already sent."""
        if not self.sq:
            return None
        base = self.sq[0].seq
        seq = base + ((wire_seq - base) & wire.SEQ_MASK)
        return seq if seq < self.tx_seq else None

    def on_ack(self, wire_seq: int) -> None:
        seq = self._outstanding(wire_seq)
        if seq is not None:
            self.complete_upto(seq)

    def on_nak(self, wire_seq: int, syndrome: int, rnr_timer: int) -> None:
        seq = self._outstanding(wire_seq)
        if seq is None:
            return
        self.complete_upto(seq - 1)
        item = self.sq[0]
        if syndrome != wire.NAK_RNR:
            status = ibv_wc_status(syndrome) if syndrome in ibv_wc_status._value2member_map_ else None
            self.qp.fail(item, status or ibv_wc_status.IBV_WC_REM_OP_ERR)
            return
        if self.qp.rnr_retry != RNR_FOREVER and item.rnr_tries >= self.qp.rnr_retry:
            self.qp.fail(item, ibv_wc_status.IBV_WC_RNR_RETRY_EXC_ERR)
            return
        item.rnr_tries += 1
        self.tx_seq = item.seq  # go back: the responder drops everything after the NAK'd request
        self.rnr_wait = True
        delay = RNR_DELAY_MS[rnr_timer & 31] / 1000
        self.deadline = None
        self.qp.engine.set_timer(
            self._rnr_timer, time.monotonic() + delay, self._rnr_resume, self.qp.on_engine_error
        )

    def _rnr_resume(self) -> None:
        self.rnr_wait = False
        self._arm()
        self.qp.pump()

    def response_targets(self, hdr: wire.Header) -> list[memoryview] | None:
        """Where a READ response's data goes: the READ's local buffers, if it is the one outstanding."""
        seq = self._outstanding(hdr.seq)
        if seq is None:
            return None
        item = self.sq[seq - self.sq[0].seq]
        if item.opcode != WR.IBV_WR_RDMA_READ or hdr.length != item.length:
            return None
        return list(item.local) if isinstance(item.local, list) else None

    def on_read_response(self, hdr: wire.Header, placed: bool) -> None:
        seq = self._outstanding(hdr.seq)
        if seq is None:
            return
        if not placed:
            self.qp.fail(self.sq[seq - self.sq[0].seq], ibv_wc_status.IBV_WC_BAD_RESP_ERR)
            return
        self.complete_upto(seq)

    def on_atomic_response(self, hdr: wire.Header) -> None:
        seq = self._outstanding(hdr.seq)
        if seq is None:
            return
        item = self.sq[seq - self.sq[0].seq]
        if item.opcode not in ATOMICS or not isinstance(item.local, list):
            self.qp.fail(item, ibv_wc_status.IBV_WC_BAD_RESP_ERR)
            return
        ATOMIC_VALUE.pack_into(item.local[0], 0, hdr.arg1)
        self.complete_upto(seq)

    # -- completion ---------------------------------------------------------------------------------------

    def complete_upto(self, seq: int) -> None:
        progressed = False
        while self.sq and self.sq[0].seq <= seq:
            item = self.sq.popleft()
            progressed = True
            if item.signaled:
                self.qp.complete_send(item, ibv_wc_status.IBV_WC_SUCCESS)
        if progressed:
            self._arm()

    def pop_all(self) -> list[Outstanding]:
        items = list(self.sq)
        self.sq.clear()
        self.tx_seq = self.next_seq
        self.rnr_wait = False
        self.deadline = None
        self._timer_armed = False
        self.qp.engine.set_timer(self, None, self._check_deadline)
        self.qp.engine.set_timer(self._rnr_timer, None, self._rnr_resume)
        return items

    def wc(self, item: Outstanding, status: ibv_wc_status) -> WC:
        return WC(
            wr_id=item.wr_id,
            status=status,
            opcode=WC_OP[item.opcode],
            qp_num=self.qp.qp_num,
            byte_len=item.length,
        )

    # -- the ack deadline ---------------------------------------------------------------------------------

    def _arm(self) -> None:
        """Restart the ack deadline from now while anything is outstanding (and not waiting out an RNR).

        Only the deadline moves; the engine's timer stays where it is and, when it fires early, is set again
        for the next look, so the busy path costs no engine wake-up.
        """
        total = self.ack_timeout
        if not self.sq or total is None or self.rnr_wait:
            self.deadline = None
            return
        now = time.monotonic()
        self.deadline = now + total
        self._look = now + self.retry_period
        self._path.reset()
        if not self._timer_armed:
            self._timer_armed = True
            self.qp.engine.set_timer(self, self._look, self._check_deadline, self.qp.on_engine_error)

    def _check_deadline(self) -> None:
        """Once per retry period without an ack: if TCP shows the path alive, the deadline starts over (the
        wait is on the remote host, as behind an RNIC that acked); past the deadline, RETRY_EXC_ERR."""
        self._timer_armed = False
        conn = self.qp.conn
        if self.deadline is not None and time.monotonic() >= self._look and conn is not None:
            conn.read_pending()  # an ack already in the socket counts: the engine was busy elsewhere
        total = self.ack_timeout
        if self.deadline is None or not self.sq or total is None:
            return
        now = time.monotonic()
        if now >= self._look:
            period = self.retry_period
            alive = self._path.alive(conn.sock) if conn is not None else False
            if alive:
                self.deadline = now + total
            elif alive is None:  # a first look, maybe late (a busy engine): give it one to compare with
                self.deadline = max(self.deadline, now + period)
            if now >= self.deadline:
                self.qp.fail(self.sq[0], ibv_wc_status.IBV_WC_RETRY_EXC_ERR)
                return
            self._look = min(now + period, self.deadline)
        self._timer_armed = True
        self.qp.engine.set_timer(self, self._look, self._check_deadline, self.qp.on_engine_error)
