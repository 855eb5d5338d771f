"""The verbs' words for why the core refused a post (enum sc_post_error, either backend's)."""

from __future__ import annotations

import errno

from libshift.core import _core
from libshift.vocabulary.attrs import QPCap
from libshift.vocabulary.errors import VerbsRDMAError
from libshift.vocabulary.wr import RecvWR, SendWR


def refusal(
    err: int, qp_num: int, cap: QPCap, state: str, wr: SendWR | RecvWR | None, send: bool, device: str = ""
) -> VerbsRDMAError:
    """The error for `wr`, refused with `err` by the QP in `state`; device: what the device said."""
    qp = f"QP {qp_num}"
    sges = wr.sges() if wr is not None else []
    if err == _core.POST_STATE:
        if send:
            return VerbsRDMAError(f"{qp}: post_send needs state RTS, the QP is {state}")
        return VerbsRDMAError(f"{qp}: post_recv needs INIT, RTR or RTS, the QP is {state}")
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
    if err == _core.POST_DEVICE:
        return VerbsRDMAError(f"{qp}: the device refused the post: {device}")
    return VerbsRDMAError(f"{qp}: out of memory", errno.ENOMEM)
