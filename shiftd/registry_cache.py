"""Peers' mappings held locally: one watch per peer NIC feeds every lookup of its keys.

Without it, each lookup cost etcd one linearizable read, and a lookup that waited (a QP connecting before
its peer published) one watch of its own. A job start has every host look up all its QPs' peers at once,
and a rail failing has every host of the rail look them up again: etcd's reads grow with hosts x QPs
(bench/fleet_scale.py, docs/scale.md). Keys are grouped by their prefix up to the last '/' (`qp/<gid>/`,
`mr/<gid>/`: one peer NIC's mappings). A group is read once and then followed by one watch
(registry_watch: resumed after a break, read again after a compaction or a wiped etcd, with DELETEs for
what vanished meanwhile); later lookups in the group are answered from memory, and one that waits is woken
by the watch's PUT. A group nobody looked up for `idle` seconds is dropped with its watch, and at most
`max_groups` are held, so a host follows its current peers only.
"""

from __future__ import annotations

import asyncio

from aetcd.utils import prefix_range_end

from shiftd.registry_conn import EtcdLink
from shiftd.registry_watch import PUT, watch_range
from shiftd.tasks import cancel_and_wait

CACHED_KINDS = ("qp", "mr")  # peers' mappings; hosts/ and nics/ are read rarely and stay direct
IDLE_SECONDS = 600.0  # a job's start and its first minutes; a failover later reads each group once again
MAX_GROUPS = 256  # peer NICs followed at once (a host's QPs reach far fewer)


class Group:
    """One peer NIC's mappings, as etcd holds them, once `ready`."""

    def __init__(self, now: float) -> None:
        self.values: dict[str, str] = {}  # key (relative to the registry prefix) -> value
        self.ready = asyncio.Event()  # set once the group has been read (and again after every resync)
        self.waiters: dict[str, list[asyncio.Future[str]]] = {}
        self.used = now
        self.task: asyncio.Task[None] | None = None

    def apply(self, kind: str, key: str, value: str | None) -> None:
        if kind == PUT and value is not None:
            self.values[key] = value
            for waiter in self.waiters.pop(key, []):
                if not waiter.done():
                    waiter.set_result(value)
        else:
            self.values.pop(key, None)

    async def answer(self, key: str, wait: float, timeout: float) -> str | None:
        """The key's value; None if absent after waiting up to `wait` s for it to appear.

        TimeoutError if the group could not be read within max(wait, timeout) (etcd unreachable).
        """
        loop = asyncio.get_running_loop()
        start = loop.time()
        self.used = start
        async with asyncio.timeout_at(start + max(wait, timeout)):
            await self.ready.wait()
        if key in self.values or loop.time() >= start + wait:
            return self.values.get(key)
        waiter: asyncio.Future[str] = loop.create_future()
        self.waiters.setdefault(key, []).append(waiter)
        try:
            async with asyncio.timeout_at(start + wait):
                return await waiter
        except TimeoutError:
            return None
        finally:
            if not waiter.done():
                waiter.cancel()
            pending = [w for w in self.waiters.get(key, []) if w is not waiter]
            if pending:
                self.waiters[key] = pending
            else:
                self.waiters.pop(key, None)


class PeerCache:
    """The groups this registry follows; `group(key)` is None for keys that are not cached."""

    def __init__(
        self, link: EtcdLink, prefix: str, idle: float = IDLE_SECONDS, max_groups: int = MAX_GROUPS
    ) -> None:
        self._link = link
        self._prefix = prefix
        self._idle = idle
        self._max = max_groups
        self._groups: dict[str, Group] = {}

    def __len__(self) -> int:
        return len(self._groups)

    @property
    def held(self) -> int:
        """Mappings held, in every group followed."""
        return sum(len(g.values) for g in self._groups.values())

    def cached(self, key: str) -> str | None:
        """What the cache holds for `key` now, without asking etcd (None: absent or not followed)."""
        name = group_name(key)
        group = self._groups.get(name) if name else None
        return group.values.get(key) if group and group.ready.is_set() else None

    def group(self, key: str) -> Group | None:
        name = group_name(key) if self._max > 0 else None  # max_groups 0: no cache at all
        if name is None:
            return None
        group = self._groups.get(name)
        if group is None:
            now = asyncio.get_running_loop().time()
            self._expire(now)
            group = self._groups[name] = Group(now)
            group.task = asyncio.get_running_loop().create_task(
                self._follow(name, group), name=f"cache:{name}"
            )
            group.task.add_done_callback(lambda _, n=name, g=group: self._ended(n, g))
        return group

    def _ended(self, name: str, group: Group) -> None:
        """A group whose watch ended (the registry stopping, or a bug) is no longer followed: forget it,
        so that a later lookup reads the group again instead of trusting what it last held."""
        if self._groups.get(name) is group:
            del self._groups[name]

    async def _follow(self, name: str, group: Group) -> None:
        start = (self._prefix + name).encode()
        events = watch_range(
            self._link,
            start,
            prefix_range_end(start),
            len(self._prefix),
            resync=True,
            on_synced=group.ready.set,
        )
        async for event in events:
            group.apply(event.type, event.key, event.value)

    def _expire(self, now: float) -> None:
        """Drop groups idle too long, and the least recently used beyond the cap; never one waited on."""
        idle = [n for n, g in self._groups.items() if now - g.used > self._idle and not g.waiters]
        by_use = sorted((g.used, n) for n, g in self._groups.items() if not g.waiters and n not in idle)
        excess = len(self._groups) - len(idle) - self._max + 1
        for name in idle + [n for _, n in by_use[: max(0, excess)]]:
            group = self._groups.pop(name)
            if group.task is not None:
                group.task.cancel()

    async def close(self) -> None:
        tasks = [g.task for g in self._groups.values() if g.task is not None]
        self._groups.clear()
        await cancel_and_wait(tasks)


def group_name(key: str) -> str | None:
    """`qp/<gid>/` for `qp/<gid>/<qpn>` (likewise mr/); None for keys that are not a peer's mapping."""
    kind, _, rest = key.partition("/")
    if kind not in CACHED_KINDS or "/" not in rest:
        return None
    return key[: key.rindex("/") + 1]
