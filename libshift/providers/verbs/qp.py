"""An RC queue pair over the core's verbs backend: transitions with the attributes RC needs, posting,
completions.

The state a caller reads is queried from the device (ibv_query_qp), because an RNIC moves a QP to ERR on
its own; posting checks use libibverbs' cached state, which is what the last modify set, as ibverbs does.
A refused post raises VerbsRDMAError with ibverbs' errno (ENOMEM: queue full, EINVAL: a bad WR).
"""

from __future__ import annotations

import errno
import os
import secrets
from collections import Counter, deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from libshift.core import _verbs
from libshift.providers import ProviderQP
from libshift.providers.refusal import refusal
from libshift.providers.verbs import convert
from libshift.providers.verbs.binding import native
from libshift.vocabulary.attrs import Endpoint, QPAttr, QPCap
from libshift.vocabulary.enums import ibv_qp_state, ibv_send_flags, ibv_wc_opcode, ibv_wr_opcode
from libshift.vocabulary.errors import VerbsRDMAError
from libshift.vocabulary.wr import WC, RecvWR, SendWR

if TYPE_CHECKING:
    from libshift.providers.verbs.cq import VerbsCQ
    from libshift.providers.verbs.memory import VerbsPD

S = ibv_qp_state
SIGNALED = int(ibv_send_flags.IBV_SEND_SIGNALED)


class VerbsQP(ProviderQP):
    def __init__(self, pd: VerbsPD, send_cq: VerbsCQ, recv_cq: VerbsCQ, cap: QPCap, sq_sig_all: bool) -> None:
        self.pd = pd
        self.ctx = pd.ctx
        self.sq_sig_all = sq_sig_all
        self.cqs = (send_cq, recv_cq)
        sizes = (cap.max_send_wr, cap.max_recv_wr, cap.max_send_sge, cap.max_recv_sge, cap.max_inline_data)
        with native(f"{self.ctx.device.name}: create_qp"):
            self.qp = _verbs.QP(pd.pd, send_cq.cq, recv_cq.cq, sizes, sq_sig_all)
        self.cap = QPCap(*self.qp.cap)  # what the device granted (at least what was asked)
        self.qp_num: int = self.qp.qp_num
        self.psn = secrets.randbits(24)
        # an error WC's opcode is undefined in ibverbs: remember what the signaled WRs were, in order
        self._sends: dict[int, deque[ibv_wc_opcode]] = {}
        self._recvs: Counter[int] = Counter()
        self.ctx.qps[self.qp_num] = self
        self.ctx.adopt(self, pd, send_cq, recv_cq)

    @property
    def state(self) -> ibv_qp_state:
        with native(f"QP {self.qp_num}: query_qp"):
            return S(self.qp.state)

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
        current, target = S(self.qp.last_state), S(attr.qp_state)
        if target == S.IBV_QPS_RTR and current != S.IBV_QPS_INIT:
            # refused as the device would, before the RTR attributes (attr.dest) are looked at
            raise VerbsRDMAError(
                f"QP {self.qp_num}: cannot go from {current.name} to {target.name}", errno.EINVAL
            )
        try:
            self._modify(current, target, attr)
        except VerbsRDMAError as exc:
            code = exc.error_code or errno.EINVAL
            move = f"cannot go from {current.name} to {target.name}"
            raise VerbsRDMAError(f"QP {self.qp_num}: {move} failed: {os.strerror(code)}", code) from None
        if target == S.IBV_QPS_RESET:
            self._sends.clear()
            self._recvs.clear()

    def _modify(self, current: ibv_qp_state, target: ibv_qp_state, attr: QPAttr) -> None:
        if target == S.IBV_QPS_INIT:
            self.qp.to_init(int(attr.qp_access_flags))
        elif target == S.IBV_QPS_RTR:
            self.qp.to_rtr(*convert.rtr_args(self.ctx.port(), attr, convert.peer_of(attr.dest, self.qp_num)))
        elif target == S.IBV_QPS_RTS and current == S.IBV_QPS_RTR:
            self.qp.to_rts(*convert.rts_args(attr, self.psn))
        elif target == S.IBV_QPS_RTS:  # RTS -> RTS may change only a few things
            self.qp.set_min_rnr_timer(attr.min_rnr_timer)
        elif target == S.IBV_QPS_ERR:
            self.qp.to_err()
        elif target == S.IBV_QPS_RESET:
            self.qp.reset()
        else:
            raise VerbsRDMAError(f"QP {self.qp_num}: {target.name} is not a state this provider moves to")

    def to_error(self) -> None:
        """To ERR on the provider's own account (a CQ overrun the device did not act on)."""
        with native(f"QP {self.qp_num}: modify_qp to ERR"):
            self.qp.to_err()

    @property
    def native(self) -> _verbs.QP:
        return self.qp

    def post_send(self, wr: SendWR) -> None:
        self.post_send_list((wr,))

    def post_send_list(self, wrs: Sequence[SendWR]) -> None:
        err, posted = self.qp.post_send(wrs)
        for wr in wrs[:posted]:
            if self.sq_sig_all or wr.send_flags & SIGNALED:
                opcode = convert.WC_OPCODE[ibv_wr_opcode(wr.opcode)]
                self._sends.setdefault(wr.wr_id, deque()).append(opcode)
        if err != _verbs.POST_OK:
            raise self.refused(err, wrs[posted] if posted < len(wrs) else None, send=True)

    def post_recv(self, wr: RecvWR) -> None:
        self.post_recv_list((wr,))

    def post_recv_list(self, wrs: Sequence[RecvWR]) -> None:
        err, posted = self.qp.post_recv(wrs)
        for wr in wrs[:posted]:
            self._recvs[wr.wr_id] += 1
        if err != _verbs.POST_OK:
            raise self.refused(err, wrs[posted] if posted < len(wrs) else None, send=False)

    def refused(self, err: int, wr: SendWR | RecvWR | None, send: bool) -> VerbsRDMAError:
        state = S(self.qp.last_state).name
        return refusal(err, self.qp_num, self.cap, state, wr, send, _verbs.error())

    def completed(self, wc: WC) -> WC:
        """The libshift WC of one of this QP's completions (the WR's opcode stands in on an error WC)."""
        if wc.status == 0:
            is_recv = bool(wc.opcode & ibv_wc_opcode.IBV_WC_RECV)
        else:
            is_recv = wc.wr_id not in self._sends and self._recvs[wc.wr_id] > 0
        if is_recv:
            self._recvs[wc.wr_id] -= 1
            if self._recvs[wc.wr_id] <= 0:
                del self._recvs[wc.wr_id]
            return convert.work_completion(wc, ibv_wc_opcode.IBV_WC_RECV)
        ops = self._sends.get(wc.wr_id)
        opcode = ops.popleft() if ops else ibv_wc_opcode.IBV_WC_SEND
        if ops is not None and not ops:
            del self._sends[wc.wr_id]
        return convert.work_completion(wc, opcode)

    def close(self) -> None:
        self.ctx.release(self)
        self.ctx.qps.pop(self.qp_num, None)
        with native(f"QP {self.qp_num}: destroy_qp"):
            self.qp.close()
