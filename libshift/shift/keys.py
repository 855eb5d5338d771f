"""The peer's backup rkeys, looked up through the agent by the rkey the application already uses.

The peer publishes each backup key as the backup of the key before it: its backup's rkey under its default
rkey, its backup's backup's under its backup's. A lookup is a gRPC call that may wait for etcd, so the whole
chain is looked up in the background the first time a WR names an rkey, and a switch only collects it. The
peer publishes the deepest link first, so once the first link is there the rest (if any) are too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from libshift.agent import Agent, AgentError

log = logging.getLogger("libshift.shift")
LOOKUP_WAIT = 5.0


class RemoteKeys:
    def __init__(self, agent: Agent, depth: int) -> None:
        self._agent = agent
        self._depth = depth  # our backup paths: no deeper key can be used
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="libshift-keys")
        self._chains: dict[tuple[str, int], Future[list[int]]] = {}

    def prefetch(self, gid: str, rkey: int, found: Callable[[list[int]], None] | None = None) -> None:
        """Look the chain of (gid, rkey) up in the background, once; `found(chain)` is called with it when
        it is in (at once when it is already, else on the lookup's thread)."""
        chain = self._chains.get((gid, rkey))
        if chain is None:
            chain = self._chains[(gid, rkey)] = self._pool.submit(self._chain, gid, rkey)
        if found is not None:
            chain.add_done_callback(lambda done: _tell(done, found))

    def backup(self, gid: str, rkey: int, depth: int = 1) -> int | None:
        """The rkey of the peer MR (gid, rkey) on its `depth`-th backup (1: the backup, 2: the backup's
        backup); None when it has none (the WR will fail remotely)."""
        self.prefetch(gid, rkey)
        try:
            chain = self._chains[(gid, rkey)].result(timeout=LOOKUP_WAIT + 1)
        except TimeoutError:
            return None
        return chain[depth - 1] if depth <= len(chain) else None

    def known(self, gid: str, depth: int) -> dict[int, int]:
        """The peer's default rkey -> its rkey on its `depth`-th backup, for every MR of the peer `gid`
        whose chain has been looked up by now (none is waited for)."""
        found = {}
        for (peer, rkey), chain in list(self._chains.items()):
            if peer == gid and chain.done() and not chain.cancelled() and chain.exception() is None:
                links = chain.result()
                if depth <= len(links):
                    found[rkey] = links[depth - 1]
        return found

    def _chain(self, gid: str, rkey: int) -> list[int]:
        """The peer MR's rkeys on its backups, in order, as far as it published them (and we can use)."""
        chain: list[int] = []
        wait = LOOKUP_WAIT
        while len(chain) < self._depth:
            try:
                found = self._agent.lookup_mr(gid, rkey, wait=wait)
            except AgentError as exc:
                log.warning("backup key of peer MR %s rkey %#x: %s", gid, rkey, exc)
                break
            if found is None:
                if not chain:
                    log.warning("peer MR %s rkey %#x has no published backup key", gid, rkey)
                break
            chain.append(found.backup_rkey)
            gid, rkey, wait = found.backup_gid, found.backup_rkey, 0.0
        return chain

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _tell(chain: Future[list[int]], found: Callable[[list[int]], None]) -> None:
    if not chain.cancelled() and chain.exception() is None:
        found(chain.result())
