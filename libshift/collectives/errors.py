"""How a collective fails, and the alarm that tells every rank when no path is left.

A host that loses every NIC breaks the ring: its neighbours' QPs give up at once and say why (NoPathLeft,
from libshift/shift/lost.py), but a rank further along the ring only sees its ring stall, until its timeout.
So the rank that meets NoPathLeft first raises the alarm in the store the ranks share, and every rank that
waits on the ring looks at it between two waits: the whole job hears it within a fraction of a second.
"""

from __future__ import annotations

import logging

from libshift.collectives.store import Store

log = logging.getLogger("libshift.collectives")
CHECK_EVERY = 0.25  # seconds a rank waits on its ring between two looks at the alarm


class CollectiveError(RuntimeError):
    """The ring failed under a collective (a work request failed, or no progress within the timeout)."""


class NoPathLeft(CollectiveError):
    """A host lost every NIC that a QP of the ring could use. The network cannot carry this job on; the
    framework must restart it (from its last checkpoint) or shrink the group without that host."""


WHAT_TO_DO = "shift cannot carry this job on: restart it from its last checkpoint, or shrink the group"


class Alarm:
    """The ring's alarm: one key in the store, set once by the first rank that finds no path left."""

    def __init__(self, store: Store, prefix: str, rank: int) -> None:
        self.store, self.key, self.rank = store, f"{prefix}/no-path-left", rank
        self.raised = False

    def raise_for(self, why: str) -> NoPathLeft:
        """Tell every rank `why` (a QP's words); the error for this rank to raise."""
        if not self.raised:
            self.raised = True
            try:
                self.store.set(self.key, why.encode())
            except Exception as exc:  # the store is the framework's: its failure must not hide ours
                log.warning("rank %d: the other ranks were not told of the lost path (%s)", self.rank, exc)
        return NoPathLeft(f"rank {self.rank}: {why}. {WHAT_TO_DO}")

    def check(self) -> None:
        """Raise NoPathLeft if another rank raised the alarm."""
        try:
            if not self.store.check([self.key]):
                return
            why = self.store.get(self.key).decode()
        except Exception as exc:
            log.debug("rank %d: the alarm could not be read (%s)", self.rank, exc)
            return
        self.raised = True
        raise NoPathLeft(f"rank {self.rank}: the ring is broken, another rank found: {why}. {WHAT_TO_DO}")
