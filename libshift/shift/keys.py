"""The peer's backup rkeys, looked up through the agent by the rkey the application already uses.

The peer publishes each backup key as the backup of the key before it: its backup's rkey under its default
rkey, its backup's backup's under its backup's. A lookup is a gRPC call that may wait for etcd, so the whole
chain is looked up in the background the first time a WR names an rkey, and a switch only collects it. The
peer publishes the deepest link first, so once the first link is there the rest (if any) are too.

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

from libshift.agent import Agent, AgentError

log = logging.getLogger("libshift.shift")
LOOKUP_WAIT = 5.0  # a switch waits this long for a key the peer may still be publishing
PREFETCH_WAIT = 0.5  # a background lookup waits this long
PENDING_MAX = 64  # background lookups in flight at most
KEPT = 4096  # chains kept at most

Key = tuple[str, int]  # the peer's default gid and rkey


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

    def prefetch(self, gid: str, rkey: int, found: Callable[[list[int]], None] | None = None) -> None:
        """Look the chain of (gid, rkey) up in the background, once; `found(chain)` is called with it when
        it is in (at once when it is already, else on the lookup's thread). Skipped while PENDING_MAX
        lookups are in flight."""
        with self._lock:
            chain = self._chains.get((gid, rkey))
            if chain is not None:
                self._chains.move_to_end((gid, rkey))
            elif self._pending < PENDING_MAX:
                self._pending += 1
                chain = self._chains[(gid, rkey)] = self._pool.submit(self._chain, gid, rkey, PREFETCH_WAIT)
                chain.add_done_callback(self._ended)
                self._forget_oldest()
        if chain is not None and found is not None:
            chain.add_done_callback(lambda done: _tell(done, found))

    def backup(self, gid: str, rkey: int, depth: int = 1) -> int | None:
        """The rkey of the peer MR (gid, rkey) on its `depth`-th backup (1: the backup, 2: the backup's
        backup); None when it has none (the WR will fail remotely). Waits for it up to LOOKUP_WAIT."""
        with self._lock:
            chain = self._chains.get((gid, rkey))
        links = _result(chain) if chain is not None and chain.done() else None
        if links is None:  # not looked up, not yet, or missed in the background: now, on this thread
            links = self._chain(gid, rkey, LOOKUP_WAIT) or []
            done: Future[list[int] | None] = Future()
            done.set_result(links)
            with self._lock:
                self._chains[(gid, rkey)] = done
                self._chains.move_to_end((gid, rkey))
                self._forget_oldest()
        return links[depth - 1] if depth <= len(links) else None

    def known(self, gid: str, depth: int) -> dict[int, int]:
        """The peer's default rkey -> its rkey on its `depth`-th backup, for every MR of the peer `gid`
        whose chain has been looked up by now (none is waited for)."""
        with self._lock:
            chains = list(self._chains.items())
        found = {}
        for (peer, rkey), chain in chains:
            links = _result(chain) if peer == gid and chain.done() else None
            if links and depth <= len(links):
                found[rkey] = links[depth - 1]
        return found

    def _ended(self, _: Future[list[int] | None]) -> None:
        with self._lock:
            self._pending -= 1

    def _forget_oldest(self) -> None:
        """Under the lock: the least recently used chains beyond KEPT go (a pending one stays)."""
        for key in list(self._chains)[: max(0, len(self._chains) - KEPT)]:
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
    """A finished lookup's chain; None if it is not known (missed, cancelled or failed)."""
    if chain.cancelled() or chain.exception() is not None:
        return None
    return chain.result()


def _tell(chain: Future[list[int] | None], found: Callable[[list[int]], None]) -> None:
    links = _result(chain)
    if links is not None:
        found(links)
