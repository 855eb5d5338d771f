"""An RC queue pair over pyverbs: transitions with the attribute masks RC needs, posting, completions.

The state a caller reads is queried from the device (ibv_query_qp), because an RNIC moves a QP to ERR on
its own; posting checks use libibverbs' cached state, which is what the last modify set, as ibverbs does.
A failed post raises VerbsRDMAError with ibverbs' errno (ENOMEM: queue full, EINVAL: a bad WR).
"""

from __future__ import annotations

import errno
import secrets
import threading
from collections import Counter, deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from libshift.providers import ProviderQP
from libshift.providers.verbs import convert
from libshift.providers.verbs.binding import errno_of, load, mapped, rdma_error
from libshift.vocabulary.attrs import Endpoint, QPAttr, QPCap
from libshift.vocabulary.enums import ibv_qp_state, ibv_send_flags, ibv_wc_opcode, ibv_wr_opcode
from libshift.vocabulary.errors import VerbsRDMAError
from libshift.vocabulary.wr import WC, RecvWR, SendWR

if TYPE_CHECKING:
    from libshift.providers.verbs.cq import VerbsCQ
    from libshift.providers.verbs.memory import VerbsPD

S = ibv_qp_state
RECV_STATES = {S.IBV_QPS_INIT, S.IBV_QPS_RTR, S.IBV_QPS_RTS, S.IBV_QPS_ERR}
SEND_STATES = {S.IBV_QPS_RTS, S.IBV_QPS_SQD, S.IBV_QPS_SQE, S.IBV_QPS_ERR}
SIGNALED = int(ibv_send_flags.IBV_SEND_SIGNALED)
INLINE = int(ibv_send_flags.IBV_SEND_INLINE)


class VerbsQP(ProviderQP):
    def __init__(self, pd: VerbsPD, send_cq: VerbsCQ, recv_cq: VerbsCQ, cap: QPCap, sq_sig_all: bool) -> None:
        self.pd = pd
        self.ctx = pd.ctx
        self.sq_sig_all = sq_sig_all
        self.cqs = (send_cq, recv_cq)
        pv = load()
        init = pv.qp.QPInitAttr(
            qp_type=pv.enums.IBV_QPT_RC,
            scq=send_cq.cq,
            rcq=recv_cq.cq,
            cap=pv.qp.QPCap(
                cap.max_send_wr, cap.max_recv_wr, cap.max_send_sge, cap.max_recv_sge, cap.max_inline_data
            ),
            sq_sig_all=int(sq_sig_all),
        )
        with mapped(f"{self.ctx.device.name}: create_qp"):
            self.qp = pv.qp.QP(pd.pd, init)
        # what the device granted (at least what was asked): pyverbs' init attr shows only part of what
        # ibv_create_qp wrote back (rxe: 4 send WRs asked, 7 granted, init still says 4), ibv_query_qp all
        with mapped(f"{self.ctx.device.name}: query_qp"):
            got = self.qp.query(pv.enums.IBV_QP_CAP)[0].cap
        self.cap = QPCap(
            got.max_send_wr, got.max_recv_wr, got.max_send_sge, got.max_recv_sge, got.max_inline_data
        )
        self.qp_num: int = self.qp.qp_num
        self.psn = secrets.randbits(24)
        # an error WC's opcode is undefined in ibverbs: remember what the signaled WRs were, in order
        self._sends: dict[int, deque[ibv_wc_opcode]] = {}
        self._recvs: Counter[int] = Counter()
        self._lock = threading.Lock()  # a post and close() never overlap: pyverbs would use the freed QP
        self._closed = False
        self.ctx.qps[self.qp_num] = self

    @property
    def state(self) -> ibv_qp_state:
        with mapped(f"QP {self.qp_num}: query_qp"):
            attr, _init = self.qp.query(load().enums.IBV_QP_STATE)
        return S(attr.qp_state)

    def endpoint(self) -> Endpoint:
        port = self.ctx.port()
        return Endpoint(
            gid=self.ctx.gid(),
            qpn=self.qp_num,
            psn=self.psn,
            device=self.ctx.device.name,
            provider="verbs",
            provider_data={"lid": port.lid, "mtu": port.active_mtu, "link_layer": port.link_layer},
        )

    def modify(self, attr: QPAttr) -> None:
        convert.check_attr(attr)
        current, target = S(self.qp.qp_state), S(attr.qp_state)
        if target == S.IBV_QPS_RTR and current != S.IBV_QPS_INIT:
            # refused as the device would, before the RTR attributes (attr.dest) are looked at
            raise VerbsRDMAError(
                f"QP {self.qp_num}: cannot go from {current.name} to {target.name}", errno.EINVAL
            )
        if target == S.IBV_QPS_RTR:
            convert.peer_of(attr.dest, self.qp_num)
        pv_attr, mask = convert.modify_args(load(), self.ctx.port(), attr, current, self.qp_num, self.psn)
        try:
            self.qp.modify(pv_attr, mask)
        except load().error as exc:
            raise rdma_error(
                f"QP {self.qp_num}: cannot go from {current.name} to {target.name}", exc, errno.EINVAL
            ) from None
        if target == S.IBV_QPS_RESET:
            self._sends.clear()
            self._recvs.clear()

    def to_error(self) -> None:
        """To ERR on the provider's own account (a CQ overrun the device did not act on)."""
        with self._open("modify_qp"), mapped(f"QP {self.qp_num}: modify_qp to ERR"):
            self.qp.modify(load().qp.QPAttr(qp_state=int(S.IBV_QPS_ERR)), load().enums.IBV_QP_STATE)

    def post_send(self, wr: SendWR) -> None:
        with self._open("post_send"):
            self._post_send(wr)

    def _post_send(self, wr: SendWR) -> None:
        state = S(self.qp.qp_state)
        if state not in SEND_STATES:
            raise VerbsRDMAError(f"QP {self.qp_num}: post_send needs state RTS, the QP is {state.name}")
        sges = wr.sges()
        if len(sges) > self.cap.max_send_sge:
            raise VerbsRDMAError(
                f"QP {self.qp_num}: {len(sges)} SGEs, max_send_sge is {self.cap.max_send_sge}"
            )
        length = sum(s.length for s in sges)
        if wr.send_flags & INLINE and length > self.cap.max_inline_data:
            limit = self.cap.max_inline_data
            raise VerbsRDMAError(f"QP {self.qp_num}: {length} B inline, max_inline_data is {limit}")
        self._post(self.qp.post_send, convert.send_wr(load(), wr), "send", self.cap.max_send_wr)
        if self.sq_sig_all or wr.send_flags & SIGNALED:
            self.cqs[0].expect()
            opcode = convert.WC_OPCODE[ibv_wr_opcode(wr.opcode)]
            self._sends.setdefault(wr.wr_id, deque()).append(opcode)

    def post_recv(self, wr: RecvWR) -> None:
        with self._open("post_recv"):
            self._post_recv(wr)

    def _post_recv(self, wr: RecvWR) -> None:
        state = S(self.qp.qp_state)
        if state not in RECV_STATES:
            raise VerbsRDMAError(
                f"QP {self.qp_num}: post_recv needs INIT, RTR or RTS, the QP is {state.name}"
            )
        self._post(self.qp.post_recv, convert.recv_wr(load(), wr), "receive", self.cap.max_recv_wr)
        self._recvs[wr.wr_id] += 1
        self.cqs[1].expect()

    @contextmanager
    def _open(self, verb: str) -> Iterator[None]:
        """Holds off close() for the duration; a QP closed before is refused (pyverbs would crash)."""
        with self._lock:
            if self._closed:
                raise VerbsRDMAError(f"QP {self.qp_num}: {verb} on a closed QP")
            yield

    def _post(self, post: Any, wr: Any, queue: str, depth: int) -> None:
        try:
            post(wr)
        except load().error as exc:
            if errno_of(exc) == errno.ENOMEM:
                raise VerbsRDMAError(
                    f"QP {self.qp_num}: {queue} queue full ({depth} WRs)", errno.ENOMEM
                ) from None
            raise rdma_error(f"QP {self.qp_num}: post_{queue.replace('receive', 'recv')}", exc) from None

    def completed(self, raw: Any) -> WC:
        """The libshift WC of a pyverbs WC of this QP (the WR's opcode stands in on an error WC)."""
        if raw.status == 0:
            is_recv = bool(raw.opcode & ibv_wc_opcode.IBV_WC_RECV)
        else:
            is_recv = raw.wr_id not in self._sends and self._recvs[raw.wr_id] > 0
        if is_recv:
            self._recvs[raw.wr_id] -= 1
            if self._recvs[raw.wr_id] <= 0:
                del self._recvs[raw.wr_id]
            return convert.work_completion(raw, ibv_wc_opcode.IBV_WC_RECV)
        ops = self._sends.get(raw.wr_id)
        opcode = ops.popleft() if ops else ibv_wc_opcode.IBV_WC_SEND
        if ops is not None and not ops:
            del self._sends[raw.wr_id]
        return convert.work_completion(raw, opcode)

    def close(self) -> None:
        self.ctx.qps.pop(self.qp_num, None)
        with self._lock, mapped(f"QP {self.qp_num}: destroy_qp"):
            self._closed = True
            self.qp.close()
