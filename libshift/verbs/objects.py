"""The public verbs objects, shaped after pyverbs; each delegates to its provider's object.

These are the objects the failover layer wraps. Argument checks that hold for every provider live here, so
a provider only implements the transport.
"""

from __future__ import annotations

import dataclasses
import errno
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

from libshift.device import find_device
from libshift.providers import DeviceInfo, ProviderContext, ProviderCQ
from libshift.verbs.masks import check_mask
from libshift.vocabulary.attrs import GID, DeviceAttr, Endpoint, PortAttr, QPAttr, QPCap
from libshift.vocabulary.enums import ibv_qp_state, ibv_qp_type
from libshift.vocabulary.errors import VerbsError, VerbsRDMAError
from libshift.vocabulary.wr import WC, RecvWR, SendWR

Buffer = Any  # collections.abc.Buffer from Python 3.12 on: anything memoryview() takes


class _Closable:
    """`with` support and idempotent close, as pyverbs objects have."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class Context(_Closable):
    """An opened device: `Context(name="mlx5_0")`; `provider` picks one when names clash."""

    def __init__(self, name: str, provider: str | None = None) -> None:
        prov, device = find_device(name, provider)
        self.device: DeviceInfo = device
        self.name = name
        self.impl: ProviderContext = prov.open(device)

    def query_gid(self, port_num: int = 1, index: int = 0) -> GID:
        """The device's GID (tcp: the IPv4-mapped IPv6 form of the netdev's address), a str and a GID."""
        return GID(self.impl.gid())

    def query_device(self) -> DeviceAttr:
        """The device's limits (max_cqe, max_sge, max_qp_wr): what queues may be sized to."""
        return self.impl.query_device()

    def query_port(self, port_num: int = 1) -> PortAttr:
        """The state of the port the device's QPs use (one port per device here, whatever `port_num`)."""
        return self.impl.query_port()

    def close(self) -> None:
        self.impl.close()


class PD(_Closable):
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.impl = ctx.impl.alloc_pd()

    def close(self) -> None:
        self.impl.close()


class MR(_Closable):
    """Registered memory; `buf` is its address (for SGE and remote_addr), `view` its bytes.

    Without `buffer` the MR allocates its memory. With one (a bytearray, a memoryview, a numpy array: any
    writable C-contiguous buffer of at least `length` bytes) it registers that memory, as ibv_reg_mr does
    with an application's pointer: RDMA reads and writes the caller's bytes in place, no copy.
    """

    def __init__(self, pd: PD, length: int, access: int, buffer: Buffer | None = None) -> None:
        if length <= 0:
            raise VerbsRDMAError(f"MR length must be positive, got {length}")
        self.pd = pd
        self.impl = pd.impl.reg_mr(length, int(access), None if buffer is None else _bytes_of(buffer, length))

    buf = property(lambda self: self.impl.addr)
    length = property(lambda self: self.impl.length)
    lkey = property(lambda self: self.impl.lkey)
    rkey = property(lambda self: self.impl.rkey)
    access = property(lambda self: self.impl.access)
    view = property(lambda self: self.impl.view)

    def read(self, length: int, offset: int = 0) -> bytes:
        self._check(length, offset)
        return bytes(self.impl.view[offset : offset + length])

    def write(self, data: bytes, length: int | None = None, offset: int = 0) -> None:
        length = len(data) if length is None else length
        self._check(length, offset)
        self.impl.view[offset : offset + length] = data[:length]

    def _check(self, length: int, offset: int) -> None:
        if offset < 0 or length < 0 or offset + length > self.impl.length:
            raise VerbsRDMAError(f"range {offset}+{length} is outside the MR of {self.impl.length} bytes")

    def close(self) -> None:
        self.impl.close()


def _bytes_of(buffer: Buffer, length: int) -> memoryview:
    """The first `length` bytes of `buffer` as a flat writable memoryview, or a one-line error why not."""
    try:
        view = memoryview(buffer)
    except TypeError:
        raise VerbsRDMAError(f"MR buffer: a {type(buffer).__name__} is not a buffer") from None
    if view.readonly:
        raise VerbsRDMAError("MR buffer: read-only memory cannot be registered (RDMA writes into it)")
    if not view.c_contiguous:
        raise VerbsRDMAError("MR buffer: memory must be C-contiguous")
    view = view.cast("B")
    if len(view) < length:
        raise VerbsRDMAError(f"MR buffer: {len(view)} bytes, fewer than the length {length}")
    return view[:length]


class CompChannel(_Closable):
    """Blocking waits for completions: arm a CQ with req_notify(), then get_cq_event()."""

    def __init__(self, ctx: Context) -> None:
        self.impl = ctx.impl.create_comp_channel()

    def get_cq_event(self, cq: CQ | None = None, timeout: float | None = None) -> CQ:
        """Block until an armed CQ of this channel gets a completion; TimeoutError after `timeout` s."""
        got = self.impl.get_cq_event(timeout)
        if got is None:
            raise TimeoutError(f"no completion event within {timeout} s")
        return got.owner  # type: ignore[return-value]

    def close(self) -> None:
        self.impl.close()


class CQ(_Closable):
    def __init__(
        self,
        ctx: Context,
        cqe: int,
        cq_context: object = None,
        channel: CompChannel | None = None,
        comp_vector: int = 0,
    ) -> None:
        if cqe <= 0:
            raise VerbsRDMAError(f"CQ size must be positive, got {cqe}")
        self.ctx = ctx
        self.channel = channel
        self.impl: ProviderCQ = ctx.impl.create_cq(cqe, channel.impl if channel else None)
        self.impl.owner = self

    def poll(self, num_entries: int = 1) -> tuple[int, list[WC]]:
        """Up to num_entries completions, oldest first, as (count, list) like pyverbs."""
        wcs = self.impl.poll(num_entries)
        return len(wcs), wcs

    def req_notify(self, solicited_only: bool = False) -> None:
        if self.channel is None:
            raise VerbsRDMAError("req_notify needs a CQ created with a completion channel")
        self.impl.req_notify(solicited_only)

    def ack_events(self, num_events: int = 1) -> None:
        """Accepted for pyverbs compatibility; events need no acknowledgement here."""

    def close(self) -> None:
        self.impl.close()


@dataclass
class QPInitAttr:
    """How to create a QP (RC only): its CQs, its queue sizes, and whether every send is signaled; fields
    in pyverbs' order (its defaults are UD and sq_sig_all=1: a pyverbs RC program names qp_type anyway).

    It holds two CQ objects, so it stands here beside QP rather than in the vocabulary beneath."""

    qp_type: ibv_qp_type = ibv_qp_type.IBV_QPT_RC
    qp_context: object = None
    scq: CQ | None = None
    rcq: CQ | None = None
    srq: None = None
    cap: QPCap = field(default_factory=QPCap)
    sq_sig_all: bool = False


class QP(_Closable):
    """An RC queue pair: RESET -> INIT -> RTR -> RTS, ERR on a transport error."""

    def __init__(self, pd: PD, init_attr: QPInitAttr, qp_attr: QPAttr | None = None) -> None:
        """With `qp_attr` the new QP goes to INIT with it, as pyverbs' RC QPs do (RTR needs the peer)."""
        if init_attr.qp_type != ibv_qp_type.IBV_QPT_RC:
            raise VerbsRDMAError("only RC queue pairs are supported", errno.EOPNOTSUPP)
        if init_attr.scq is None or init_attr.rcq is None:
            raise VerbsRDMAError("QPInitAttr needs scq and rcq")
        if init_attr.srq is not None:
            raise VerbsRDMAError("shared receive queues are not supported", errno.EOPNOTSUPP)
        for cq in (init_attr.scq, init_attr.rcq):
            if cq.ctx is not pd.ctx:
                raise VerbsRDMAError("the CQs of a QP must belong to the QP's device context")
        self.pd = pd
        self.impl = pd.impl.create_qp(
            init_attr.scq.impl, init_attr.rcq.impl, init_attr.cap, init_attr.sq_sig_all
        )
        if qp_attr is not None:
            self.to_init(qp_attr)

    @property
    def qp_num(self) -> int:
        return self.impl.qp_num

    @property
    def qp_state(self) -> ibv_qp_state:
        return self.impl.state

    @property
    def cap(self) -> QPCap:
        return self.impl.cap

    def endpoint(self) -> Endpoint:
        """This QP's connection data, to hand to the peer."""
        return self.impl.endpoint()

    def modify(self, attr: QPAttr, attr_mask: int | None = None) -> None:
        """ibv_modify_qp: towards attr.qp_state. With pyverbs' `attr_mask` (ibv_qp_attr_mask), the mask
        must hold what ibverbs requires of the transition for an RC QP; without one, every field counts."""
        if attr_mask is not None:
            check_mask(self.qp_state, attr, attr_mask)
        if attr.qp_state == ibv_qp_state.IBV_QPS_RTR and self.qp_state == ibv_qp_state.IBV_QPS_INIT:
            self._name_peer(attr)  # (from any other state the provider refuses the transition itself)
        self.impl.modify(attr)

    def to_init(self, attr: QPAttr | None = None) -> None:
        self._to(ibv_qp_state.IBV_QPS_INIT, attr)

    def to_rtr(self, attr: QPAttr) -> None:
        """To RTR (from RESET by way of INIT, as pyverbs does)."""
        if self.qp_state == ibv_qp_state.IBV_QPS_RESET:
            self.to_init(attr)
        self._to(ibv_qp_state.IBV_QPS_RTR, attr)

    def to_rts(self, attr: QPAttr | None = None) -> None:
        """To RTS (from RESET or INIT by way of RTR, as pyverbs does)."""
        if attr is not None and self.qp_state in (ibv_qp_state.IBV_QPS_RESET, ibv_qp_state.IBV_QPS_INIT):
            self.to_rtr(attr)
        self._to(ibv_qp_state.IBV_QPS_RTS, attr)

    def to_err(self) -> None:
        self._to(ibv_qp_state.IBV_QPS_ERR, None)

    def connect(self, remote: Endpoint, attr: QPAttr | None = None) -> None:
        """RESET -> INIT -> RTR -> RTS towards `remote` in one call, with `attr` for the rest."""
        attr = attr or QPAttr()
        attr.dest = remote
        for step in (self.to_init, self.to_rtr, self.to_rts):
            step(attr)

    def _to(self, state: ibv_qp_state, attr: QPAttr | None) -> None:
        attr = attr or QPAttr()
        attr.qp_state = state
        self.modify(attr)

    def _name_peer(self, attr: QPAttr) -> None:
        """Sets attr.dest from pyverbs' ah_attr, dest_qp_num and rq_psn when it is not given (as pyverbs'
        to_rtr sets qp_state), so the providers and the shift layer read one spelling; an Endpoint that
        names no provider is taken as one of this QP's provider."""
        peer = attr.peer()
        if peer is None:
            raise VerbsError(
                "to_rtr needs attr.dest, the peer's Endpoint, or as pyverbs has it attr.ah_attr "
                "(AHAttr(is_global=1, gr=GlobalRoute(dgid=...))) and attr.dest_qp_num"
            )
        if not peer.provider:  # GID, QPN and PSN alone: a peer of this QP's own provider
            attr.dest = dataclasses.replace(peer, provider=self.pd.ctx.device.provider)

    def post_send(self, wr: SendWR) -> None:
        self.impl.post_send(wr)

    def post_send_list(self, wrs: Sequence[SendWR]) -> None:
        """Post several send WRs at once, in order (ibv_post_send with a chained list): those before a
        refused WR stay posted, the error is raised, the rest are not posted."""
        self.impl.post_send_list(wrs)

    def post_recv(self, wr: RecvWR) -> None:
        self.impl.post_recv(wr)

    def post_recv_list(self, wrs: Sequence[RecvWR]) -> None:
        """Post several receive WRs at once, in order (ibv_post_recv with a chained list): those before
        a refused WR stay posted, the error is raised, the rest are not posted."""
        self.impl.post_recv_list(wrs)

    def close(self) -> None:
        self.impl.close()
