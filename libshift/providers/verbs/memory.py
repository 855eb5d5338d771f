"""Protection domains and memory regions over the core's verbs backend.

An MR registers memory that Python can see: its own anonymous mmap, or the caller's buffer (zero-copy: the
RNIC reads and writes the caller's memory); the backend's MR holds the buffer while it is registered.
"""

from __future__ import annotations

import mmap
from typing import TYPE_CHECKING

from libshift.core import _verbs
from libshift.providers import ProviderMR, ProviderPD
from libshift.providers.verbs.binding import native

if TYPE_CHECKING:
    from libshift.providers.verbs.context import VerbsContext
    from libshift.providers.verbs.cq import VerbsCQ
    from libshift.providers.verbs.qp import VerbsQP
    from libshift.vocabulary.attrs import QPCap


class VerbsMR(ProviderMR):
    def __init__(self, pd: VerbsPD, length: int, access: int, buffer: memoryview | None = None) -> None:
        self.pd = pd
        self.length = length
        self.access = access
        # the verbs layer hands over the caller's buffer already checked and cut to `length` bytes
        self.view = memoryview(mmap.mmap(-1, length)) if buffer is None else buffer
        with native(f"{pd.ctx.device.name}: reg_mr of {length} bytes"):
            self.mr = _verbs.MR(pd.pd, self.view, length, access)
        self.addr, self.lkey, self.rkey = self.mr.addr, self.mr.lkey, self.mr.rkey
        pd.ctx.adopt(self, pd)

    def close(self) -> None:
        self.pd.ctx.release(self)
        with native(f"{self.pd.ctx.device.name}: dereg_mr"):
            self.mr.close()


class VerbsPD(ProviderPD):
    def __init__(self, ctx: VerbsContext) -> None:
        self.ctx = ctx
        with native(f"{ctx.device.name}: alloc_pd"):
            self.pd = _verbs.PD(ctx.native)
        ctx.adopt(self)

    def reg_mr(self, length: int, access: int, buffer: memoryview | None = None) -> VerbsMR:
        return VerbsMR(self, length, access, buffer)

    def create_qp(self, send_cq: VerbsCQ, recv_cq: VerbsCQ, cap: QPCap, sq_sig_all: bool) -> VerbsQP:  # type: ignore[override]
        from libshift.providers.verbs.qp import VerbsQP

        return VerbsQP(self, send_cq, recv_cq, cap, sq_sig_all)

    def close(self) -> None:
        self.ctx.release(self)
        with native(f"{self.ctx.device.name}: dealloc_pd"):
            self.pd.close()
