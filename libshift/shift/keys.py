"""The peer's backup rkeys, looked up through the agent by the rkey the application already uses.

The peer publishes each backup key as the backup of the key before it: its backup's rkey under its default
rkey, its backup's backup's under its backup's. A lookup is a gRPC call that may wait for etcd, so the whole
chain is looked up in the background the first time a WR names an rkey, and a switch only collects it. The
peer publishes the deepest link first, so once the first link is there the rest (if any) are too. Each QP
follows its peer's chains (`follow`): it is told each one once, as it is found, so that its maps in the core
have every key known without being handed them all again at every hand-over (per-message MRs made that
O(keys kept) per post, 4096 of them: seconds per thousand messages on a backup path).

An application may register memory per message, so rkeys come and go: a background lookup waits only
PREFETCH_WAIT for a key (the peer publishes before it hands the rkey out, so a key not there by then is
late or already withdrawn), at most PENDING_MAX of them are in flight (beyond, a switch looks up what it
needs itself), a key not found is looked up again when a switch needs it, and at most KEPT chains are kept,
the least recently used going first. Without these, lookups of keys withdrawn meanwhile queued up behind
each other for 5 s apiece, and a switch waiting for a live key's lookup behind them gave up and posted
with the default path's rkey.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import islice

from libshift.agent import Agent, AgentError

log = logging.getLogger("libshift.shift")
LOOKUP_WAIT = 5.0  # a switch waits this long for a key the peer may still be publishing
PREFETCH_WAIT = 0.5  # a background lookup waits this long
PENDING_MAX = 64  # background lookups in flight at most
KEPT = 4096  # chains kept at most

Key = tuple[str, int]  # the peer's default gid and rkey
Found = Callable[[int, list[int]], bool]  # (rkey, its chain) -> whether to go on being told (False: closed)


class RemoteKeys:
    def __init__(self, agent: Agent, depth: int) -> None:
        self._agent = agent
        self._depth = depth  # our backup paths: no deeper key can be used
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="libshift-keys")
        # over the chains and the count pending; reentrant: a lookup done already calls back at once
        self._lock = threading.RLock()
        # a chain: the backup rkeys found; None while not known (a background lookup missed: looked up
        # again when a switch needs it), [] when the peer published none
        self._chains: OrderedDict[Key, Future[list[int] | None]] = OrderedDict()
        self._pending = 0
        self._closed = False  # lookups cut short by close() say nothing
        self._followers: dict[str, list[Found]] = {}  # by the peer's default gid

    def follow(self, gid: str, found: Found) -> None:
        """Call `found(rkey, chain)` for every chain of the peer `gid` kept now, then for each one found
        later (on the thread that found it), until it returns False."""
        with self._lock:
            self._followers.setdefault(gid, []).append(found)  # first: a chain found meanwhile is told too
            kept = [(rkey, _result(chain)) for (peer, rkey), chain in self._chains.items() if peer == gid]
        for rkey, links in kept:
            if links and not found(rkey, links):
                self._unfollow(gid, [found])
                return

    def prefetch(self, gid: str, rkey: int) -> None:
        """Look the chain of (gid, rkey) up in the background, once (its followers are told when it is
        in). Skipped while PENDING_MAX lookups are in flight."""
        with self._lock:
            if (gid, rkey) in self._chains:
                self._chains.move_to_end((gid, rkey))
            elif self._pending < PENDING_MAX:
                self._pending += 1
                chain = self._chains[(gid, rkey)] = self._pool.submit(self._chain, gid, rkey, PREFETCH_WAIT)
                chain.add_done_callback(lambda done: self._ended(gid, rkey, done))
                self._forget_oldest()

    def backup(self, gid: str, rkey: int, depth: int = 1) -> int | None:
        """The rkey of the peer MR (gid, rkey) on its `depth`-th backup (1: the backup, 2: the backup's
        backup); None when it has none (the WR will fail remotely). Waits for it up to LOOKUP_WAIT."""
        with self._lock:
            chain = self._chains.get((gid, rkey))
        links = _result(chain) if chain is not None else None
        if links is None:  # not looked up, not yet, or missed in the background: now, on this thread
            links = self._chain(gid, rkey, LOOKUP_WAIT) or []
            done: Future[list[int] | None] = Future()
            done.set_result(links)
            with self._lock:
                self._chains[(gid, rkey)] = done
                self._chains.move_to_end((gid, rkey))
                self._forget_oldest()
            self._tell(gid, rkey, links)
        return links[depth - 1] if depth <= len(links) else None

    def _ended(self, gid: str, rkey: int, chain: Future[list[int] | None]) -> None:
        with self._lock:
            self._pending -= 1
        self._tell(gid, rkey, _result(chain))

    def _tell(self, gid: str, rkey: int, links: list[int] | None) -> None:
        """A chain found: to the peer's followers, on this thread (they take the core's mutex; the lock is
        not held unless a prefetch's lookup ended before its callback was added, which then runs inline)."""
        if not links:
            return
        with self._lock:
            followers = list(self._followers.get(gid, ()))
        self._unfollow(gid, [found for found in followers if not found(rkey, links)])

    def _unfollow(self, gid: str, gone: list[Found]) -> None:
        if gone:
            with self._lock:
                self._followers[gid] = [found for found in self._followers.get(gid, ()) if found not in gone]

    def _forget_oldest(self) -> None:
        """Under the lock: the least recently used chains beyond KEPT go (a pending one stays)."""
        excess = len(self._chains) - KEPT
        for key in list(islice(self._chains, max(0, excess))):  # not a copy of all KEPT keys per post
            if self._chains[key].done():
                del self._chains[key]

    def _chain(self, gid: str, rkey: int, wait: float) -> list[int] | None:
        """The peer MR's rkeys on its backups, in order, as far as it published them (and we can use);
        None when the first is not found (or cannot be asked for) within a background lookup's wait."""
        final = wait >= LOOKUP_WAIT
        chain: list[int] = []
        while len(chain) < self._depth:
            try:
                found = self._agent.lookup_mr(gid, rkey, wait=wait)
            except AgentError as exc:
                if not self._closed:
                    log.warning("backup key of peer MR %s rkey %#x: %s", gid, rkey, exc)
                return chain if chain or final else None
            if found is None:
                if chain:
                    break
                if final:
                    log.warning("peer MR %s rkey %#x has no published backup key", gid, rkey)
                return chain if final else None
            chain.append(found.backup_rkey)
            gid, rkey, wait = found.backup_gid, found.backup_rkey, 0.0
        return chain

    def close(self) -> None:
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)


def _result(chain: Future[list[int] | None]) -> list[int] | None:
    """A lookup's chain; None if it is not known (not done, missed, cancelled or failed)."""
    if not chain.done() or chain.cancelled() or chain.exception() is not None:
        return None
    return chain.result()
