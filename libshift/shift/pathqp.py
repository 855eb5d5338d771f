"""The provider QP of one path of a ShiftQP, posting through the fast path.

The fast path takes every completion of a ShiftQP's provider QPs straight from their CQs, so the QP's
posts go through it too (its raw posts, as they are): a provider that keeps books on what was posted
(the verbs backend's opcodes of error completions) is then never half-told. Everything else is the
provider QP's own (`__getattr__`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from libshift.verbs import QP, RecvWR, SendWR


class PathQP:
    __slots__ = ("fast", "index", "qp")

    def __init__(self, qp: QP, fast: Any, index: int) -> None:
        self.qp, self.fast, self.index = qp, fast, index

    def __getattr__(self, name: str) -> Any:
        return getattr(self.qp, name)

    def post_send(self, wr: SendWR) -> None:
        self.post_send_list((wr,))

    def post_send_list(self, wrs: Sequence[SendWR]) -> None:
        err, posted = self.fast.post_raw_send(self.index, wrs)
        if err:
            raise self.qp.impl.refused(err, wrs[posted] if posted < len(wrs) else None, send=True)

    def post_recv(self, wr: RecvWR) -> None:
        self.post_recv_list((wr,))

    def post_recv_list(self, wrs: Sequence[RecvWR]) -> None:
        err, posted = self.fast.post_raw_recv(self.index, wrs)
        if err:
            raise self.qp.impl.refused(err, wrs[posted] if posted < len(wrs) else None, send=False)
