"""Protection domains and memory regions over pyverbs.

An MR registers memory that Python can see: its own anonymous mmap, or the caller's buffer (zero-copy: the
RNIC reads and writes the caller's memory). pyverbs' MR takes the address to register, so `view` and
`addr` name the same bytes the RNIC uses; the buffer is kept alive by the MR.
"""

from __future__ import annotations

import ctypes
import mmap
from typing import TYPE_CHECKING

from libshift.providers import ProviderMR, ProviderPD
from libshift.providers.verbs.binding import load, mapped

if TYPE_CHECKING:
    from libshift.providers.verbs.context import VerbsContext
    from libshift.providers.verbs.cq import VerbsCQ
    from libshift.providers.verbs.qp import VerbsQP
    from libshift.vocabulary.attrs import QPCap


def address_of(view: memoryview) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


class VerbsMR(ProviderMR):
    def __init__(self, pd: VerbsPD, length: int, access: int, buffer: memoryview | None = None) -> None:
        self.pd = pd
        self.length = length
        self.access = access
        # the verbs layer hands over the caller's buffer already checked and cut to `length` bytes
        self.view = memoryview(mmap.mmap(-1, length)) if buffer is None else buffer  # keeps it alive
        self.addr = address_of(self.view)
        with mapped(f"{pd.ctx.device.name}: reg_mr of {length} bytes"):
            self.mr = load().mr.MR(pd.pd, length, access, address=self.addr)
        self.lkey, self.rkey = self.mr.lkey, self.mr.rkey

    def close(self) -> None:
        with mapped(f"{self.pd.ctx.device.name}: dereg_mr"):
            self.mr.close()


class VerbsPD(ProviderPD):
    def __init__(self, ctx: VerbsContext) -> None:
        self.ctx = ctx
        with mapped(f"{ctx.device.name}: alloc_pd"):
            self.pd = load().pd.PD(ctx.context)

    def reg_mr(self, length: int, access: int, buffer: memoryview | None = None) -> VerbsMR:
        return VerbsMR(self, length, access, buffer)

    def create_qp(self, send_cq: VerbsCQ, recv_cq: VerbsCQ, cap: QPCap, sq_sig_all: bool) -> VerbsQP:  # type: ignore[override]
        from libshift.providers.verbs.qp import VerbsQP

        return VerbsQP(self, send_cq, recv_cq, cap, sq_sig_all)

    def close(self) -> None:
        with mapped(f"{self.ctx.device.name}: dealloc_pd"):
            self.pd.close()
