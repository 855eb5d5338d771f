"""The peer's backup rkeys, looked up through the agent by the rkey the application already uses.

A lookup is a gRPC call that may wait for etcd, so it starts in the background the first time a WR names an
rkey, and a switch only collects the answer.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor

from libshift.agent import Agent, AgentError

log = logging.getLogger("libshift.shift")
LOOKUP_WAIT = 5.0


class RemoteKeys:
    def __init__(self, agent: Agent) -> None:
        self._agent = agent
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="libshift-keys")
        self._lookups: dict[tuple[str, int], Future[int | None]] = {}

    def prefetch(self, gid: str, rkey: int) -> None:
        if (gid, rkey) not in self._lookups:
            self._lookups[(gid, rkey)] = self._pool.submit(self._lookup, gid, rkey)

    def backup(self, gid: str, rkey: int) -> int | None:
        """The backup rkey of the peer MR (gid, rkey); None when it has none (the WR will fail remotely)."""
        self.prefetch(gid, rkey)
        try:
            return self._lookups[(gid, rkey)].result(timeout=LOOKUP_WAIT + 1)
        except TimeoutError:
            return None

    def _lookup(self, gid: str, rkey: int) -> int | None:
        try:
            found = self._agent.lookup_mr(gid, rkey, wait=LOOKUP_WAIT)
        except AgentError as exc:
            log.warning("backup key of peer MR %s rkey %#x: %s", gid, rkey, exc)
            return None
        if found is None:
            log.warning("peer MR %s rkey %#x has no published backup key", gid, rkey)
            return None
        return found.backup_rkey

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
