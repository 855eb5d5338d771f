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
        self._check(*self.fast.post_raw_send(self.index, wrs), wrs, send=True)

    def post_recv(self, wr: RecvWR) -> None:
        self.post_recv_list((wr,))

    def post_recv_list(self, wrs: Sequence[RecvWR]) -> None:
        self._check(*self.fast.post_raw_recv(self.index, wrs), wrs, send=False)

    def _check(self, err: int, posted: int, wrs: Sequence[SendWR] | Sequence[RecvWR], send: bool) -> None:
        """The provider's error for the first WR the core refused (those before it stay posted)."""
        if err:
            raise self.qp.impl.refused(err, wrs[posted] if posted < len(wrs) else None, send=send)
