"""Copies of inline sends, so that a send posted again after a switch carries what the application posted.

ibverbs copies an inline send's bytes when it is posted, and the application may reuse its buffer as soon as
post_send returns. The ledger keeps every send until its completion is handed over and may post it again on
the other path (rewind), by then reading whatever the application wrote there since. So a resilient QP
copies an inline send's bytes into a slot of this pool when it is posted and points its ledger WR at the
slot; the ledger gives the slot back when it lets the entry go (Ledger.finished, Ledger.drop).

The pool belongs to the ShiftContext (`ctx.inline`, closed with it) and is used under the context's lock.
Its memory is registered on every device over the same bytes, as a ShiftMR's is, with each backup's lkey
in `ctx.lkeys` so that ShiftQP._post translates a slot's lkey like any other; its rkey is never published (no
peer addresses it). An SGE's lkey must belong to the QP's PD, so the memory is kept per PD, in slots of the
QP's max_inline_data: the provider refuses a longer inline send, which therefore never needs a slot.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from libshift.shift.memory import LkeyMap, deregister_twins, register_twins
from libshift.shift.paths import BACKUP, PRIMARY
from libshift.verbs import MR, PD, SGE, SendWR

CHUNK_SLOTS = 32  # slots registered at once: a registration per 32 inline sends in flight at most


@dataclass(frozen=True, slots=True, eq=False)
class Slot:
    """Room for the bytes of one inline send, until the ledger lets the send go."""

    shelf: Shelf
    addr: int
    lkey: int

    def release(self) -> None:
        self.shelf.free.append(self)


class Shelf:
    """The slots of one size in one PD and its twins: chunks of them are added as needed, kept until close."""

    def __init__(self, pds: dict[str, PD], size: int, lkeys: dict[str, LkeyMap]) -> None:
        self.pds, self.size = pds, size
        self.free: list[Slot] = []
        self._lkeys = lkeys
        self._chunks: list[dict[str, MR]] = []

    @property
    def taken(self) -> int:
        return len(self._chunks) * CHUNK_SLOTS - len(self.free)

    def take(self) -> Slot:
        if not self.free:
            self._grow()
        return self.free.pop()

    def _grow(self) -> None:
        # access 0: only read, by the local device
        chunk = register_twins(self.pds, self.size * CHUNK_SLOTS, 0, self._lkeys)
        self._chunks.append(chunk)
        mr = chunk[PRIMARY]
        self.free += (Slot(self, mr.buf + i * self.size, mr.lkey) for i in reversed(range(CHUNK_SLOTS)))

    def close(self) -> None:
        for chunk in self._chunks:
            deregister_twins(chunk, self._lkeys)
        self._chunks.clear()
        self.free.clear()


class InlinePool:
    """The inline copies of one context: `keep` when a send is posted, `Slot.release` when it is done."""

    def __init__(self, lkeys: dict[str, LkeyMap]) -> None:
        self._lkeys = lkeys  # the context's: backup path -> (default lkey -> lkey on that path)
        self._shelves: dict[tuple[PD, int], Shelf] = {}

    @property
    def taken(self) -> int:
        """Slots holding the bytes of a send not yet done."""
        return sum(shelf.taken for shelf in self._shelves.values())

    def keep(self, wr: SendWR, pds: dict[str, PD], size: int, data: bytes | None = None) -> Slot | None:
        """Copy the bytes `wr` gathers into a slot of `size` bytes in `pds` (path -> PD of the QP's paths)
        and point `wr` at it.

        The bytes are read from the SGEs' addresses, as libibverbs reads an inline send's, or are `data`
        (the fast path's copy, taken when it was posted, handover.py). None (`wr` kept
        as it is) when there is nothing to copy, when they do not fit (the provider has refused such a
        send, or will when it is posted), or when an SGE's lkey is none of this context's MRs: such a WR
        could not go on the backup path anyway, and its address may not be memory at all.
        """
        sg = wr.sg
        length = sum(sge.length for sge in sg)
        known = self._lkeys[BACKUP]  # every MR has a twin on every backup path
        if not 0 < length <= size or not all(sge.lkey in known for sge in sg):
            return None
        shelf = self._shelves.get((pds[PRIMARY], size))
        if shelf is None:
            shelf = self._shelves[(pds[PRIMARY], size)] = Shelf(pds, size, self._lkeys)
        slot = shelf.take()
        if data is not None:
            ctypes.memmove(slot.addr, data, length)
        at = slot.addr
        for sge in sg if data is None else ():
            ctypes.memmove(at, sge.addr, sge.length)
            at += sge.length
        wr.sg = [SGE(slot.addr, length, slot.lkey)]
        return slot

    def close(self) -> None:
        for shelf in self._shelves.values():
            shelf.close()
        self._shelves.clear()
