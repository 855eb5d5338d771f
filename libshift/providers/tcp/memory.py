"""Protection domains and memory regions of the tcp provider, and the key checks both ends rely on.

An MR owns anonymous mmap'd memory or holds the caller's buffer; its `addr` is the real address of that
memory, as with pyverbs, so an SGE or a remote address is `mr.buf + offset`. Every access goes through
`local()` or `remote()`, which return a memoryview of exactly the bytes asked for, or None when keys,
bounds, PD or access flags forbid it.
"""

from __future__ import annotations

import ctypes
import mmap
import secrets
from typing import TYPE_CHECKING

from libshift.providers import ProviderMR, ProviderPD
from libshift.vocabulary.enums import ibv_access_flags

if TYPE_CHECKING:
    from libshift.providers.tcp.context import TcpContext
    from libshift.providers.tcp.cq import TcpCQ
    from libshift.providers.tcp.qp import TcpQP
    from libshift.vocabulary.attrs import QPCap

LOCAL_WRITE = int(ibv_access_flags.IBV_ACCESS_LOCAL_WRITE)  # a plain int: IntFlag arithmetic is slow


class TcpMR(ProviderMR):
    def __init__(
        self, pd: TcpPD, length: int, access: int, lkey: int, rkey: int, buffer: memoryview | None
    ) -> None:
        self.pd = pd
        self.length = length
        self.access = access
        self.lkey, self.rkey = lkey, rkey
        self.view = memoryview(mmap.mmap(-1, length)) if buffer is None else buffer
        self.addr = ctypes.addressof(ctypes.c_char.from_buffer(self.view))

    def slice(self, addr: int, length: int) -> memoryview | None:
        offset = addr - self.addr
        if offset < 0 or length < 0 or offset + length > self.length:
            return None
        return self.view[offset : offset + length]

    def close(self) -> None:
        self.pd.forget(self)


class TcpPD(ProviderPD):
    def __init__(self, ctx: TcpContext) -> None:
        self.ctx = ctx
        self._by_lkey: dict[int, TcpMR] = {}
        self._by_rkey: dict[int, TcpMR] = {}

    def reg_mr(self, length: int, access: int, buffer: memoryview | None = None) -> TcpMR:
        with self.ctx.engine.lock:
            lkey, rkey = self.ctx.new_key(), self.ctx.new_key()
            mr = TcpMR(self, length, access, lkey, rkey, buffer)
            self._by_lkey[lkey] = mr
            self._by_rkey[rkey] = mr
            return mr

    def forget(self, mr: TcpMR) -> None:
        with self.ctx.engine.lock:
            self._by_lkey.pop(mr.lkey, None)
            self._by_rkey.pop(mr.rkey, None)
            self.ctx.release_key(mr.lkey)
            self.ctx.release_key(mr.rkey)

    def local(self, lkey: int, addr: int, length: int, write: bool) -> memoryview | None:
        """The local bytes an SGE names, if its lkey is of this PD and (for write) allows local write."""
        mr = self._by_lkey.get(lkey)
        if mr is None or (write and not mr.access & LOCAL_WRITE):
            return None
        return mr.slice(addr, length)

    def remote(self, rkey: int, addr: int, length: int, access: int) -> memoryview | None:
        """The bytes a remote request names, if its rkey is of this PD and the MR grants `access`."""
        mr = self._by_rkey.get(rkey)
        if mr is None or (mr.access & access) != access:
            return None
        return mr.slice(addr, length)

    def create_qp(self, send_cq: TcpCQ, recv_cq: TcpCQ, cap: QPCap, sq_sig_all: bool) -> TcpQP:  # type: ignore[override]
        from libshift.providers.tcp.qp import TcpQP

        return TcpQP(self, send_cq, recv_cq, cap, sq_sig_all)

    def close(self) -> None:
        with self.ctx.engine.lock:
            for mr in list(self._by_lkey.values()):
                self.forget(mr)


def random_key(taken: set[int]) -> int:
    """A fresh nonzero 32-bit key; random so that a stale or guessed key is very unlikely to hit an MR."""
    while True:
        key = secrets.randbits(32)
        if key and key not in taken:
            return key
