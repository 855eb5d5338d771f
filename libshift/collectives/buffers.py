"""Registered memory for the ring: a work buffer to copy small arrays into, and large arrays in place.

A large array is registered as it is (zero-copy: chunks are written from it, reduced into it, and placed
into it by the left neighbour), and the registration is kept, least recently used first out, because
training loops reduce the same buffers again and again and a registration costs a round trip to shiftd
(the backup key is published). A kept registration holds its array alive, so its address cannot be
reused by other memory while it is cached; the cache is bounded in bytes. Small arrays are copied: a copy
costs less than a registration. In between, an array is copied the first time and registered when the same
memory (address and size) comes again: the registration then pays for itself over the calls to come,
and a buffer used once costs no round trip.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from libshift.shift import ShiftMR, ShiftPD
from libshift.verbs import enums as e

IN_PLACE_MIN = 4 << 20  # arrays at least this large are registered in place
REUSED_MIN = 256 << 10  # arrays at least this large are registered in place when they come again
SEEN = 256  # the last arrays copied that may come again (address, size), remembered for that
CACHE_BYTES = 1 << 30  # registered arrays kept, at most this many bytes
WORK_MIN = 1 << 20
ACCESS = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE  # the left neighbour places chunks


@dataclass(frozen=True)
class Region:
    """Registered bytes: `mr` for the keys and addresses, `data` the same bytes as a flat uint8 array."""

    mr: ShiftMR
    data: np.ndarray


class Buffers:
    def __init__(self, pd: ShiftPD) -> None:
        self.pd = pd
        self._work: Region | None = None
        self._kept: OrderedDict[tuple[int, int], Region] = OrderedDict()
        self._kept_bytes = 0
        self._seen: OrderedDict[tuple[int, int], None] = OrderedDict()  # copied once, not registered

    def work(self, nbytes: int) -> Region:
        """The work buffer, at least `nbytes` long (grown by doubling, never shrunk)."""
        if self._work is None or len(self._work.data) < nbytes:
            size = max(WORK_MIN, 1 << (nbytes - 1).bit_length())
            if self._work is not None:
                self._work.mr.close()
            mr = ShiftMR(self.pd, size, ACCESS)
            self._work = Region(mr, np.frombuffer(mr.view, np.uint8))
        return self._work

    def in_place(self, array: np.ndarray, at_once: bool = True) -> Region | None:
        """`array` itself, registered, if it is writable and large enough, or used often enough, to be
        worth it; else None (copy it). `at_once`: whether a large array is registered at its first use
        (else, as a smaller one, when it comes again)."""
        if array.nbytes < REUSED_MIN or not array.flags.writeable:
            return None
        data = array.reshape(-1).view(np.uint8)
        key = (data.ctypes.data, data.nbytes)
        region = self._kept.pop(key, None)
        if region is None:
            if (data.nbytes < IN_PLACE_MIN or not at_once) and not self._again(key):
                return None
            region = Region(ShiftMR(self.pd, data.nbytes, ACCESS, buffer=data), data)
            self._kept_bytes += data.nbytes
            while self._kept and self._kept_bytes > CACHE_BYTES:
                self._drop(self._kept.popitem(last=False)[1])
        self._kept[key] = region
        return Region(region.mr, data)

    def kept(self, array: np.ndarray) -> Region | None:
        """`array`'s registration, if one is kept (none is made)."""
        data = array.reshape(-1).view(np.uint8)
        key = (data.ctypes.data, data.nbytes)
        region = self._kept.get(key)
        if region is None:
            return None
        self._kept.move_to_end(key)
        return Region(region.mr, data)

    def _again(self, key: tuple[int, int]) -> bool:
        """Whether the memory `key` was copied before (and is now forgotten); else it is remembered."""
        if self._seen.pop(key, False) is None:
            return True
        self._seen[key] = None
        if len(self._seen) > SEEN:
            self._seen.popitem(last=False)
        return False

    def _drop(self, region: Region) -> None:
        self._kept_bytes -= region.data.nbytes
        region.mr.close()

    def close(self) -> None:
        while self._kept:
            self._drop(self._kept.popitem()[1])
        if self._work is not None:
            self._work.mr.close()
            self._work = None
