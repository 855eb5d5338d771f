"""An RC queue pair of the tcp provider: states, posting, connection set-up, and errors.

The QP owns one listening socket for its whole life (its port is the QPN, which makes QPNs unique per
device address); at RTR the side with the smaller (address, QPN) connects and opens with a HELLO naming both
QPNs, the other accepts from the expected address only. The requester and responder halves (sender.py,
receiver.py) share the one connection.
"""

from __future__ import annotations

import errno
import ipaddress
import secrets
import selectors
import socket
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from libshift.gid import ipv4_of_gid
from libshift.providers import ProviderQP
from libshift.providers.tcp import wire
from libshift.providers.tcp.conn import Connection
from libshift.providers.tcp.qprules import TRANSITIONS, check_attr, rtr_peer, tcp_endpoint
from libshift.providers.tcp.receiver import Responder
from libshift.providers.tcp.sender import Outstanding, Requester
from libshift.vocabulary.attrs import Endpoint, QPAttr, QPCap
from libshift.vocabulary.enums import ibv_qp_state, ibv_wc_status
from libshift.vocabulary.errors import VerbsRDMAError
from libshift.vocabulary.wr import WC, RecvWR, SendWR

if TYPE_CHECKING:
    from libshift.providers.tcp.cq import TcpCQ
    from libshift.providers.tcp.memory import TcpPD

S = ibv_qp_state
RECV_STATES = {S.IBV_QPS_INIT, S.IBV_QPS_RTR, S.IBV_QPS_RTS}
ACK_BATCH = 16  # executed requests after which an ACK goes out at once
ACK_DELAY = 200e-6  # otherwise the longest an ACK waits for a request to ride on


class TcpQP(ProviderQP):
    def __init__(self, pd: TcpPD, send_cq: TcpCQ, recv_cq: TcpCQ, cap: QPCap, sq_sig_all: bool) -> None:
        self.pd = pd
        self.ctx = pd.ctx
        self.engine = pd.ctx.engine
        self.send_cq, self.recv_cq = send_cq, recv_cq
        self.cap = cap
        self.sq_sig_all = sq_sig_all
        self._state = S.IBV_QPS_RESET
        self.listener = self.ctx.new_socket()
        self.listener.listen(8)
        self.qp_num = self.listener.getsockname()[1]
        self.psn = secrets.randbits(24)
        self.access = 0
        self.timeout, self.retry_cnt, self.rnr_retry, self.min_rnr_timer = 14, 7, 7, 12
        self.remote: Endpoint | None = None
        self.conn: Connection | None = None
        self._pending: Connection | None = None  # accepted, HELLO not yet seen
        self._connecting: socket.socket | None = None
        self.requester = Requester(self)
        self.responder = Responder(self)
        self._ack_timer = object()
        self._ack_timer_armed = False
        self.ctx.qps.add(self)

    # -- state --------------------------------------------------------------------------------------------

    @property
    def state(self) -> ibv_qp_state:
        return self._state

    @property
    def in_error(self) -> bool:
        return self._state == S.IBV_QPS_ERR

    @property
    def remote_qpn(self) -> int:
        return self.remote.qpn if self.remote else 0

    def endpoint(self) -> Endpoint:
        return tcp_endpoint(self.ctx.device.name, self.ctx.address, self.qp_num, self.psn)

    def modify(self, attr: QPAttr) -> None:
        with self.engine.lock:
            target, current = S(attr.qp_state), self._state
            if target == S.IBV_QPS_RESET:
                self._reset()
                return
            if target == S.IBV_QPS_ERR:
                self.enter_error()
                return
            if (current, target) not in TRANSITIONS:
                raise VerbsRDMAError(f"QP {self.qp_num}: cannot go from {current.name} to {target.name}")
            check_attr(attr)
            if target == S.IBV_QPS_INIT:
                self.access = int(attr.qp_access_flags)
            elif target == S.IBV_QPS_RTR:
                self._to_rtr(attr)
            else:
                self.timeout, self.retry_cnt, self.rnr_retry = attr.timeout, attr.retry_cnt, attr.rnr_retry
                self.requester.configure(self.timeout, self.retry_cnt)
                if current == S.IBV_QPS_RTR:
                    self.requester.start(self.psn if attr.sq_psn is None else attr.sq_psn)
            self._state = target
            self.pump()

    def _to_rtr(self, attr: QPAttr) -> None:
        dest, remote_ip = rtr_peer(self.qp_num, attr)
        self.remote = dest
        self.min_rnr_timer = attr.min_rnr_timer
        self.responder.start(dest.psn if attr.rq_psn is None else attr.rq_psn)
        mine = (ipaddress.IPv4Address(self.ctx.address), self.qp_num)
        theirs = (ipaddress.IPv4Address(remote_ip), dest.qpn)
        if mine < theirs:
            sock = self.ctx.new_socket()
            err = sock.connect_ex((remote_ip, int(dest.provider_data["port"])))
            if err not in (0, errno.EINPROGRESS):
                sock.close()  # the peer is unreachable: requests will time out, as on an RNIC
                return
            self._connecting = sock
            self.engine.watch(sock.fileno(), selectors.EVENT_WRITE, self._connected, self.on_engine_error)
        else:
            self.engine.watch(
                self.listener.fileno(), selectors.EVENT_READ, self._accept, self.on_engine_error
            )

    def _connected(self, mask: int) -> None:
        sock, self._connecting = self._connecting, None
        if sock is None:
            return
        self.engine.unwatch(sock.fileno())
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            sock.close()
            return
        assert self.remote is not None
        self.conn = Connection(self.engine, sock, self)
        self.conn.send_frame([wire.pack(wire.Op.HELLO, self.qp_num, imm=self.remote.qpn)])

    def _accept(self, mask: int) -> None:
        try:
            sock, (host, _port) = self.listener.accept()
        except OSError:
            return
        if self.remote is None or host != ipv4_of_gid(self.remote.gid) or self.conn is not None:
            sock.close()
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._pending is not None:
            self._pending.close()
        self._pending = Connection(self.engine, sock, self)

    def _reset(self) -> None:
        self._drop_connection()
        self.requester.pop_all()
        self.responder.pop_all()
        self.remote = None
        self._state = S.IBV_QPS_RESET

    def _drop_connection(self) -> None:
        for conn in (self.conn, self._pending):
            if conn is not None:
                conn.close()
        if self._connecting is not None:
            self.engine.unwatch(self._connecting.fileno())
            self._connecting.close()
        self.conn = self._pending = self._connecting = None
        self.engine.unwatch(self.listener.fileno())

    def enter_error(self) -> None:
        """Go to ERR: every outstanding WR on both queues completes WR_FLUSH_ERR; the connection closes
        once what is queued on it (a NAK) has been sent."""
        if self.in_error:
            return
        self._state = S.IBV_QPS_ERR
        for item in self.requester.pop_all():
            self.send_cq.push(self.requester.wc(item, ibv_wc_status.IBV_WC_WR_FLUSH_ERR))
        for recv in self.responder.pop_all():
            self.recv_cq.push(self.responder.flush_wc(recv))
        self.engine.unwatch(self.listener.fileno())
        if self.conn is not None:
            self.conn.close_when_sent()

    def fail(self, item: Outstanding, status: ibv_wc_status) -> None:
        """Complete `item` with an error, then go to ERR (the rest flushes)."""
        if item in self.requester.sq:
            self.requester.sq.remove(item)
        self.complete_send(item, status)
        self.enter_error()

    def on_engine_error(self, exc: BaseException) -> None:
        self.enter_error()

    # -- posting ------------------------------------------------------------------------------------------

    def post_send(self, wr: SendWR) -> None:
        self.post_send_list((wr,))

    def post_send_list(self, wrs: Sequence[SendWR]) -> None:
        """Queue the WRs under one hold of the lock and, on the caller's thread, write what the connection
        can take now, together (Connection gathers queued requests into one sendmsg; the rest goes when
        the socket has room, from whichever thread leads the engine). A refused WR ends the list after
        what came before it."""
        with self.engine.lock:
            state = self._state
            if state is not S.IBV_QPS_RTS and state is not S.IBV_QPS_ERR:
                raise VerbsRDMAError(f"QP {self.qp_num}: post_send needs state RTS, the QP is {state.name}")
            try:
                for wr in wrs:
                    self.requester.post(wr)
            finally:
                if state is S.IBV_QPS_ERR:  # posted to an ERR QP: it completes as a flush
                    self.enter_error_flush()
                else:
                    if self.conn is not None:
                        self.conn.pump()
                    self._after_post()

    def _after_post(self) -> None:
        """Bookkeeping that may wait until the request is on the wire: start the ack deadline, and drop
        the ACK timer if the request carried the ack (its firing would wake a waiting thread for nothing)."""
        self.requester.after_post()
        if self._ack_timer_armed and self.responder.ack_seq is None:
            self._cancel_ack_timer()

    def post_recv(self, wr: RecvWR) -> None:
        self.post_recv_list((wr,))

    def post_recv_list(self, wrs: Sequence[RecvWR]) -> None:
        """Queue the receives under one hold of the lock (a switch moves all of a QP's at once); a
        refused WR ends the list after what came before it."""
        with self.engine.lock:
            if self._state is S.IBV_QPS_ERR:
                try:
                    for wr in wrs:
                        self.responder.post(wr)
                finally:  # posted to an ERR QP: they complete as flushes
                    for recv in self.responder.pop_all():
                        self.recv_cq.push(self.responder.flush_wc(recv))
                return
            if self._state not in RECV_STATES:
                raise VerbsRDMAError(
                    f"QP {self.qp_num}: post_recv needs INIT, RTR or RTS, the QP is {self._state.name}"
                )
            for wr in wrs:
                self.responder.post(wr)

    def enter_error_flush(self) -> None:
        """In ERR a new send WR completes at once with WR_FLUSH_ERR, as on an RNIC."""
        for item in self.requester.pop_all():
            self.send_cq.push(self.requester.wc(item, ibv_wc_status.IBV_WC_WR_FLUSH_ERR))

    def pump(self) -> None:
        if self.conn is not None and self._state == S.IBV_QPS_RTS:
            self.conn.pump()

    def send_response(self, header: bytes, data: memoryview | None = None) -> None:
        if self.conn is not None:
            self.conn.send_frame([header] if data is None else [header, data])

    # -- completions --------------------------------------------------------------------------------------

    def complete_send(self, item: Outstanding, status: ibv_wc_status) -> None:
        if not self.send_cq.push(self.requester.wc(item, status), solicited=False):
            self.enter_error()

    def complete_recv(self, wc: WC, solicited: bool) -> None:
        if not self.recv_cq.push(wc, solicited):
            self.enter_error()

    # -- Connection sink ----------------------------------------------------------------------------------

    def on_header(self, conn: Connection, hdr: wire.Header) -> list[memoryview] | None:
        if conn is not self.conn or self._state is S.IBV_QPS_ERR:  # (a pending conn is not self.conn)
            return None
        if hdr.op in wire.REQUESTS:
            return self.responder.on_request(hdr)
        if hdr.op == wire.Op.READ_RESP:
            return self.requester.response_targets(hdr)
        return None

    def on_frame(self, conn: Connection, hdr: wire.Header, placed: bool) -> None:
        if conn is self._pending:
            self._hello(conn, hdr)
            return
        if conn is not self.conn or self._state is S.IBV_QPS_ERR:
            return
        op = hdr.op
        if op in wire.REQUESTS:
            if hdr.flags & wire.FLAG_ACK:
                self.requester.on_ack(hdr.ack)
            self.responder.on_request_done(hdr, placed)
        elif op == wire.Op.ACK:
            self.requester.on_ack(hdr.seq)
        elif op == wire.Op.NAK:
            self.requester.on_nak(hdr.seq, hdr.imm, hdr.arg1)
        elif op == wire.Op.READ_RESP:
            self.requester.on_read_response(hdr, placed)
        elif op == wire.Op.ATOMIC_RESP:
            self.requester.on_atomic_response(hdr)
        else:  # a second HELLO: the peer is confused, the stream cannot be trusted
            self.send_response(wire.pack(wire.Op.NAK, hdr.seq, imm=ibv_wc_status.IBV_WC_REM_INV_REQ_ERR))
            self.enter_error()

    def _hello(self, conn: Connection, hdr: wire.Header) -> None:
        self._pending = None
        if hdr.op != wire.Op.HELLO or hdr.seq != self.remote_qpn or hdr.imm != self.qp_num:
            conn.close()  # not our peer: keep waiting for the right one
            return
        self.engine.unwatch(self.listener.fileno())
        self.conn = conn
        self.pump()

    def after_input(self, conn: Connection) -> None:
        """Acknowledge what was executed: at once after ACK_BATCH requests, else after ACK_DELAY unless a
        request of ours carries the ack first (an ACK frame per message costs both engines a wake-up)."""
        if self.requester.unsent:
            self.pump()  # requests not on the wire yet (the socket was full) go now, with the ack on board
        if self.responder.unacked >= ACK_BATCH:
            self._send_ack()
        elif self.responder.ack_seq is not None and not self._ack_timer_armed:
            self._ack_timer_armed = True
            self.engine.set_timer(
                self._ack_timer, time.monotonic() + ACK_DELAY, self._ack_due, self.on_engine_error
            )

    def _cancel_ack_timer(self) -> None:
        if self._ack_timer_armed:
            self._ack_timer_armed = False
            self.engine.set_timer(self._ack_timer, None, self._ack_due)

    def _ack_due(self) -> None:
        self._ack_timer_armed = False
        self._send_ack()

    def _send_ack(self) -> None:
        seq = self.responder.take_ack()
        if seq is not None and self.conn is not None and not self.conn.closed:
            self.conn.send_frame([wire.pack(wire.Op.ACK, seq)])

    def next_request(self, conn: Connection) -> list[bytes | memoryview] | None:
        if conn is not self.conn or self._state is not S.IBV_QPS_RTS:
            return None
        ack = self.responder.ack_seq
        frame = self.requester.next_request(ack)
        if frame is not None and ack is not None:
            self.responder.take_ack()  # (an ACK timer left armed finds nothing to send; see _after_post)
        return frame

    def on_broken(self, conn: Connection, reason: str) -> None:
        """The stream ended: requests now wait for the ack deadline, as they would behind a dead link."""
        if conn is self._pending:
            self._pending = None
        elif conn is self.conn:
            self.conn = None

    def close(self) -> None:
        with self.engine.lock:
            self._cancel_ack_timer()
            self._drop_connection()
            self.requester.pop_all()
            self.responder.pop_all()
            self.listener.close()
            self.ctx.qps.discard(self)
