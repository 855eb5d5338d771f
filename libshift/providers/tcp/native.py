"""The tcp provider over the C core (libshift.core): the same transport and wire, native code moving it.

SHIFT_TCP_ENGINE=native selects it (TcpProvider.open); the interpreted engine stays the default until this
one passes everything. What needs Python stays here: sockets are made inside the device's network namespace
and bound to its netdev (context.device_socket), then handed to the core, which owns them from then on; the
state-transition rules and attribute checks are the interpreted QP's own (qp.TRANSITIONS, qp.check_attr).
"""

from __future__ import annotations

import errno
import ipaddress
import mmap
import secrets
from collections.abc import Sequence

from libshift.core import _core
from libshift.providers import (
    DeviceInfo,
    ProviderChannel,
    ProviderCQ,
    ProviderMR,
    ProviderPD,
    ProviderQP,
)
from libshift.providers.tcp.context import TcpDevice
from libshift.providers.tcp.qprules import TRANSITIONS, check_attr, rtr_peer, tcp_endpoint
from libshift.vocabulary.attrs import (
    Endpoint,
    QPAttr,
    QPCap,
    ack_deadline,
    retry_period,
)
from libshift.vocabulary.enums import ibv_qp_state
from libshift.vocabulary.errors import CQOverflowError, VerbsRDMAError
from libshift.vocabulary.wr import WC, RecvWR, SendWR

S = ibv_qp_state


def _ns(seconds: float | None) -> int:
    return 0 if seconds is None else round(seconds * 1e9)


def _ip(address: str) -> int:
    return int(ipaddress.IPv4Address(address))


class NativeContext(TcpDevice):
    def __init__(self, device: DeviceInfo) -> None:
        super().__init__(device)
        self.core = _core.Context()
        self.cqs: dict[int, NativeCQ] = {}  # by cookie, for the channel's events

    def alloc_pd(self) -> NativePD:
        return NativePD(self)

    def create_comp_channel(self) -> NativeChannel:
        return NativeChannel(self)

    def create_cq(self, cqe: int, channel: NativeChannel | None) -> NativeCQ:  # type: ignore[override]
        cq = NativeCQ(self, cqe, channel)
        self.cqs[id(cq)] = cq
        return cq

    def close(self) -> None:
        self.core.close()
        self.cqs.clear()


class NativeMR(ProviderMR):
    def __init__(self, pd: NativePD, length: int, access: int, buffer: memoryview | None) -> None:
        self.length = length
        self.access = access
        self.view = memoryview(mmap.mmap(-1, length)) if buffer is None else buffer
        self.core = _core.MR(pd.core, self.view, length, access)
        self.addr, self.lkey, self.rkey = self.core.addr, self.core.lkey, self.core.rkey

    def close(self) -> None:
        self.core.close()


class NativePD(ProviderPD):
    def __init__(self, ctx: NativeContext) -> None:
        self.ctx = ctx
        self.core = _core.PD(ctx.core)

    def reg_mr(self, length: int, access: int, buffer: memoryview | None = None) -> NativeMR:
        return NativeMR(self, length, access, buffer)

    def create_qp(  # type: ignore[override]
        self, send_cq: NativeCQ, recv_cq: NativeCQ, cap: QPCap, sq_sig_all: bool
    ) -> NativeQP:
        return NativeQP(self, send_cq, recv_cq, cap, sq_sig_all)

    def close(self) -> None:
        self.core.close()


class NativeChannel(ProviderChannel):
    def __init__(self, ctx: NativeContext) -> None:
        self._ctx = ctx
        self.core = _core.Channel(ctx.core)

    def fileno(self) -> int:
        """The channel's eventfd: readable while an event may be waiting."""
        return self.core.fileno()

    def get_cq_event(self, timeout: float | None) -> NativeCQ | None:
        cookie = self.core.wait(timeout)
        return None if cookie is None else self._ctx.cqs.get(cookie)

    def wake(self) -> None:
        """Make the wait under way (or else the next one) return None now."""
        self.core.wake()

    def close(self) -> None:
        self.core.close()


class NativeCQ(ProviderCQ):
    def __init__(self, ctx: NativeContext, cqe: int, channel: NativeChannel | None) -> None:
        self._ctx = ctx
        self.cqe = cqe
        self.core = _core.CQ(ctx.core, cqe, None if channel is None else channel.core, id(self))

    def poll(self, num_entries: int) -> list[WC]:
        wcs = self.core.poll(num_entries)
        if wcs is None:
            raise CQOverflowError(f"CQ overflow: more than {self.cqe} completions were not polled")
        return wcs

    def req_notify(self, solicited_only: bool) -> None:
        self.core.req_notify(solicited_only)

    def close(self) -> None:
        self.core.close()
        self._ctx.cqs.pop(id(self), None)


class NativeQP(ProviderQP):
    def __init__(self, pd: NativePD, send_cq: NativeCQ, recv_cq: NativeCQ, cap: QPCap, sq_sig_all: bool):
        self.ctx = pd.ctx
        self.cap = cap
        self.psn = secrets.randbits(24)
        listener = self.ctx.new_socket()
        listener.listen(8)
        self.qp_num = listener.getsockname()[1]  # the port: QPNs are unique per device address
        sizes = (cap.max_send_wr, cap.max_recv_wr, cap.max_send_sge, cap.max_recv_sge, cap.max_inline_data)
        fd = listener.detach()  # the core owns it from here
        self.core = _core.QP(
            pd.core, send_cq.core, recv_cq.core, sizes, sq_sig_all, fd, self.qp_num, _ip(self.ctx.address)
        )

    @property
    def state(self) -> ibv_qp_state:
        return S(self.core.state)

    def endpoint(self) -> Endpoint:
        return tcp_endpoint(self.ctx.device.name, self.ctx.address, self.qp_num, self.psn)

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
        dest, remote_ip = rtr_peer(self.qp_num, attr)
        rq_psn = (dest.psn if attr.rq_psn is None else attr.rq_psn) & 0xFFFFFFFF
        mine, theirs = (_ip(self.ctx.address), self.qp_num), (_ip(remote_ip), dest.qpn)
        connect_fd, accept = -1, mine >= theirs  # the smaller (address, QPN) connects
        if not accept:
            sock = self.ctx.new_socket()
            err = sock.connect_ex((remote_ip, int(dest.provider_data["port"])))
            if err in (0, errno.EINPROGRESS):
                connect_fd = sock.detach()
            else:
                sock.close()  # the peer is unreachable: requests will time out, as on an RNIC
        self.core.to_rtr(_ip(remote_ip), dest.qpn, rq_psn, attr.min_rnr_timer, connect_fd, accept)

    def post_send(self, wr: SendWR) -> None:
        self.post_send_list((wr,))

    def post_send_list(self, wrs: Sequence[SendWR]) -> None:
        err, posted = self.core.post_send(wrs)
        if err != _core.POST_OK:
            raise self._refusal(err, wrs[posted] if posted < len(wrs) else None, send=True)

    def post_recv(self, wr: RecvWR) -> None:
        self.post_recv_list((wr,))

    def post_recv_list(self, wrs: Sequence[RecvWR]) -> None:
        err, posted = self.core.post_recv(wrs)
        if err != _core.POST_OK:
            raise self._refusal(err, wrs[posted] if posted < len(wrs) else None, send=False)

    def _refusal(self, err: int, wr: SendWR | RecvWR | None, send: bool) -> VerbsRDMAError:
        """The interpreted QP's words for why the core refused `wr`."""
        qp, cap = f"QP {self.qp_num}", self.cap
        sges = wr.sges() if wr is not None else []
        if err == _core.POST_STATE:
            if send:
                return VerbsRDMAError(f"{qp}: post_send needs state RTS, the QP is {self.state.name}")
            return VerbsRDMAError(f"{qp}: post_recv needs INIT, RTR or RTS, the QP is {self.state.name}")
        if err == _core.POST_QUEUE_FULL:
            if send:
                return VerbsRDMAError(f"{qp}: send queue full ({cap.max_send_wr} WRs)", errno.ENOMEM)
            return VerbsRDMAError(f"{qp}: receive queue full ({cap.max_recv_wr} WRs)", errno.ENOMEM)
        if err == _core.POST_OPCODE and isinstance(wr, SendWR):
            return VerbsRDMAError(f"{qp}: unknown send opcode {wr.opcode}")
        if err == _core.POST_SGES:
            limit = f"max_send_sge is {cap.max_send_sge}" if send else f"max_recv_sge is {cap.max_recv_sge}"
            return VerbsRDMAError(f"{qp}: {len(sges)} SGEs, {limit}")
        if err == _core.POST_INLINE:
            length = sum(sge.length for sge in sges)
            return VerbsRDMAError(f"{qp}: {length} B inline, max_inline_data is {cap.max_inline_data}")
        if err == _core.POST_ATOMIC:
            return VerbsRDMAError(f"{qp}: an atomic needs one SGE of 8 bytes")
        return VerbsRDMAError(f"{qp}: out of memory", errno.ENOMEM)

    def close(self) -> None:
        self.core.close()
