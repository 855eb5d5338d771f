"""A tcp QP over the C core, which connects it (docs/wire.md, Connection set-up) and moves its bytes.

What needs Python stays here: its QPN (qpns.py: the port of a listener of its context, and an index); the
socket it connects with, made inside the device's network namespace and bound to its netdev
(TcpContext.new_socket), then handed to the core, which owns it from then on; the state-transition rules
and attribute checks (qprules.py's); the core's post refusals in the verbs' words.
"""

from __future__ import annotations

import ipaddress
import secrets
from collections.abc import Sequence
from typing import TYPE_CHECKING

from libshift.core import _core
from libshift.providers import ProviderQP
from libshift.providers.refusal import refusal
from libshift.providers.tcp.qprules import TRANSITIONS, check_attr, rtr_peer, tcp_endpoint
from libshift.vocabulary.attrs import Endpoint, QPAttr, QPCap, ack_deadline, retry_period
from libshift.vocabulary.enums import ibv_qp_state
from libshift.vocabulary.errors import VerbsRDMAError
from libshift.vocabulary.wr import RecvWR, SendWR

if TYPE_CHECKING:
    from libshift.providers.tcp.context import TcpContext

S = ibv_qp_state


def _ns(seconds: float | None) -> int:
    return 0 if seconds is None else round(seconds * 1e9)


def _ip(address: str) -> int:
    return int(ipaddress.IPv4Address(address))


class TcpQP(ProviderQP):
    def __init__(
        self,
        ctx: TcpContext,
        pd: _core.PD,
        send_cq: _core.CQ,
        recv_cq: _core.CQ,
        cap: QPCap,
        sq_sig_all: bool,
    ) -> None:
        self.ctx = ctx
        self.cap = cap
        self.closed = False
        self.psn = secrets.randbits(24)
        self.qp_num = ctx.qpns.take()
        sizes = (cap.max_send_wr, cap.max_recv_wr, cap.max_send_sge, cap.max_recv_sge, cap.max_inline_data)
        try:
            self.core = _core.QP(pd, send_cq, recv_cq, sizes, sq_sig_all, self.qp_num, _ip(ctx.address))
        except BaseException:
            ctx.qpns.give_back(self.qp_num)
            raise

    @property
    def native(self) -> _core.QP:
        return self.core

    @property
    def state(self) -> ibv_qp_state:
        return S(self.core.state)

    def endpoint(self) -> Endpoint:
        return tcp_endpoint(self.ctx.device.name, self.ctx.refresh_address(), self.qp_num, self.psn)

    def modify(self, attr: QPAttr) -> None:
        target, current = S(attr.qp_state), self.state
        if target == S.IBV_QPS_RESET:
            self.core.reset()
            return
        if target == S.IBV_QPS_ERR:
            self.core.to_err()
            return
        if (current, target) not in TRANSITIONS:
            raise VerbsRDMAError(f"QP {self.qp_num}: cannot go from {current.name} to {target.name}")
        check_attr(attr)
        if target == S.IBV_QPS_INIT:
            self.core.to_init(int(attr.qp_access_flags))
        elif target == S.IBV_QPS_RTR:
            self._to_rtr(attr)
        else:
            self.core.to_rts(
                _ns(ack_deadline(attr.timeout, attr.retry_cnt)),
                _ns(retry_period(attr.timeout)),
                attr.rnr_retry,
                (self.psn if attr.sq_psn is None else attr.sq_psn) & 0xFFFFFFFF,
            )

    def _to_rtr(self, attr: QPAttr) -> None:
        peer = rtr_peer(self.qp_num, attr)
        address = _ip(peer.address)
        self.core.set_local_ip(_ip(self.ctx.refresh_address()))  # the NIC may have been re-addressed
        # one side connects (the core's rule), with a socket made in the device's namespace; the other accepts
        sock = self.ctx.new_socket().detach() if self.core.connects(address, peer.qpn) else -1
        self.core.to_rtr(address, peer.qpn, peer.psn & 0xFFFFFFFF, attr.min_rnr_timer, sock)

    def post_send(self, wr: SendWR) -> None:
        self.post_send_list((wr,))

    def post_send_list(self, wrs: Sequence[SendWR]) -> None:
        err, posted = self.core.post_send(wrs)
        if err != _core.POST_OK:
            raise self.refused(err, wrs[posted] if posted < len(wrs) else None, send=True)

    def post_recv(self, wr: RecvWR) -> None:
        self.post_recv_list((wr,))

    def post_recv_list(self, wrs: Sequence[RecvWR]) -> None:
        err, posted = self.core.post_recv(wrs)
        if err != _core.POST_OK:
            raise self.refused(err, wrs[posted] if posted < len(wrs) else None, send=False)

    def refused(self, err: int, wr: SendWR | RecvWR | None, send: bool) -> VerbsRDMAError:
        return refusal(err, self.qp_num, self.cap, self.state.name, wr, send)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.core.close()
            self.ctx.qpns.give_back(self.qp_num)
