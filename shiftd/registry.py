"""shiftd's etcd registry: this daemon's keys as desired state under one lease, lookups, watches.

The daemon must keep serving its agents while etcd blinks, so `put`/`delete` only record what
etcd should hold; one reconciler task makes etcd match (batched transactions under the daemon's
lease, exponential backoff on failure) and keeps the lease alive. When the lease is lost (expired
during an outage, etcd wiped, revoked behind our back) it grants a new one and re-publishes every
key: nobody has to call `put` again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import aetcd
from aetcd.utils import prefix_range_end

from shiftd.registry_auth import EtcdSecurity
from shiftd.registry_cache import MAX_GROUPS, PeerCache
from shiftd.registry_conn import (
    Endpoint,
    EtcdLink,
    RegistryUnavailable,
    one_line,
    spread_endpoints,
    wait_event,
)
from shiftd.registry_watch import PUT, WatchEvent, watch_range
from shiftd.tasks import cancel_and_wait

__all__ = ["EtcdSecurity", "Registry", "RegistryUnavailable", "WatchEvent"]

log = logging.getLogger("shiftd.registry")
MAX_TXN_OPS = 128  # etcd's default --max-txn-ops
MAX_TXN_BYTES = 1 << 20  # under etcd's default --max-request-bytes (1.5 MiB)


class Registry:
    """The daemon's view of etcd. Create, `await start()`, use, `await stop()`, on one event loop."""

    def __init__(
        self,
        endpoints: list[Endpoint],
        host: str,
        prefix: str = "/shift/v1",
        lease_ttl: int = 10,
        timeout: float = 2.0,
        retry_initial: float = 0.2,
        retry_max: float = 5.0,
        on_error: Callable[[str], None] | None = None,
        security: EtcdSecurity | None = None,
        spread: bool = False,
        peer_cache: bool = True,
    ) -> None:
        """`spread`: start with a member chosen by the host's name, not the first (a fleet's daemons
        then share the members, and a member's loss moves a third of them, not all); `peer_cache`:
        lookups of peers' mappings from the cache (registry_cache.py)."""
        self.host = host
        self.prefix = prefix.rstrip("/") + "/"
        self.lease_ttl = lease_ttl
        if spread:
            endpoints = spread_endpoints(endpoints, host)
        self._link = EtcdLink(endpoints, timeout, retry_initial, retry_max, on_error, security)
        self._desired: dict[str, str] = {}  # full key -> value this daemon wants in etcd
        self._written: dict[str, str] = {}  # full key -> value in etcd under our lease
        self._in_doubt: set[str] = set()  # keys of a transaction that failed: applied or not?
        self._dirty: set[str] = set()  # keys where the two differ
        self._lease_id: int | None = None
        self._audit = False  # an etcd call failed: its outcome, and the lease, are unknown
        self._next_refresh = 0.0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.cache = PeerCache(self._link, self.prefix, max_groups=MAX_GROUPS if peer_cache else 0)

    # ---- state the daemon reads -------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._link.connected

    @property
    def pending(self) -> int:
        """Writes (puts and deletes) not yet known to be in etcd."""
        return len(self._dirty)

    @property
    def running(self) -> bool:
        """The reconciler runs: started, not stopped, and not ended by anything else."""
        return self._task is not None and not self._task.done()

    @property
    def lease_id(self) -> int | None:
        return self._lease_id

    @property
    def errors(self) -> dict[str, int]:
        """etcd errors so far, by kind (the same kinds passed to `on_error`)."""
        return dict(self._link.errors)

    # ---- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the reconciler; returns at once, whether or not etcd is up."""
        if self._task is not None:
            return
        self._link.open()
        self._task = asyncio.get_running_loop().create_task(self._reconcile(), name=f"registry:{self.host}")

    async def stop(self, revoke: bool = True) -> None:
        """Stop every task; with `revoke`, drop the lease so this host's keys vanish now, not at expiry.

        The revoke is bounded by the timeout, so this returns promptly even when etcd is down or
        hung: the revoke is lost then, and the keys go when the lease expires.
        """
        if self._task is None:
            return
        await cancel_and_wait([self._task])
        self._task = None
        await self.cache.close()
        if revoke and self._lease_id is not None:
            try:
                await asyncio.wait_for(self._link.client.revoke_lease(self._lease_id), self._link.timeout)
                self._lease_id = None
            except Exception as exc:
                self._link.failed(exc)
        await self._link.close()

    async def wait_synced(self, timeout: float) -> bool:
        """Wait until every desired write is in etcd; False if that did not happen in time."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._dirty or self._lease_id is None or not self.connected:
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    # ---- desired state ------------------------------------------------------------------------

    def put(self, key: str, value: str) -> None:
        """Want `key` (relative to the prefix) to hold `value` under this daemon's lease."""
        full = self._full(key)
        self._desired[full] = value
        self._mark(full)

    def delete(self, key: str) -> None:
        """Want `key` gone from etcd."""
        full = self._full(key)
        self._desired.pop(full, None)
        self._mark(full)

    def _full(self, key: str) -> str:
        if not key or key.startswith("/"):
            raise ValueError(f"registry key {key!r} must be relative to {self.prefix}")
        return self.prefix + key

    def _mark(self, full: str) -> None:
        if self._written.get(full) != self._desired.get(full):
            self._dirty.add(full)
            self._wake.set()
        else:
            self._dirty.discard(full)

    # ---- the reconciler -----------------------------------------------------------------------

    async def _reconcile(self) -> None:
        """Make etcd match the desired state, forever; never raises (but stops when cancelled)."""
        backoff = self._link.backoff()
        while True:
            try:
                await self._sync()
                backoff.reset()
                self._link.ok()
                await self._idle()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._link.failed(exc) == "lease_lost":
                    self._lease_lost()
                elif self._lease_id is not None:
                    self._audit = True
                delay = backoff.next()
                if self._lease_id is not None:  # the next pass refreshes the lease first: in time
                    delay = min(delay, self.lease_ttl / 3)
                await asyncio.sleep(delay)

    async def _sync(self) -> None:
        """One pass: check the lease, keep it alive, write what differs."""
        loop = asyncio.get_running_loop()
        self._wake.clear()
        # The keep-alive comes first, and between batches: when etcd is slow (a burst, an election)
        # the audit and the writes time out and back off, and the lease must not lapse meanwhile.
        await self._refresh_if_due()
        if self._lease_id is not None and self._audit:
            await self._audit_lease()
        if self._lease_id is None:
            lease = await self._link.client.lease(self.lease_ttl)
            self._lease_id = lease.id
            self._next_refresh = loop.time() + self.lease_ttl / 3
            log.info("etcd: lease %x granted for %s (ttl %ss)", lease.id, self.host, lease.ttl)
        while self._dirty and self._lease_id is not None:
            await self._flush()
            await self._refresh_if_due()

    async def _refresh_if_due(self) -> None:
        if self._lease_id is not None and asyncio.get_running_loop().time() >= self._next_refresh:
            await self._keepalive()

    async def _idle(self) -> None:
        """Sleep until a put/delete arrives or the lease is due for a refresh."""
        delay = self._next_refresh - asyncio.get_running_loop().time()
        if self._dirty or delay <= 0:
            return
        await wait_event(self._wake, delay)

    async def _keepalive(self) -> None:
        reply = await self._link.client.refresh_lease(self._lease_id)
        if reply is None or reply.TTL <= 0:
            self._link.report("lease_lost", f"keepalive: lease {self._lease_id:x} not found")
            self._lease_lost()
        else:
            self._next_refresh = asyncio.get_running_loop().time() + self.lease_ttl / 3

    async def _audit_lease(self) -> None:
        """After a failure, learn what etcd really holds under our lease (or that it is gone).

        A transaction whose reply was lost (a member died, a leader election outlasted the
        timeout) may still have been applied. Its keys are read back rather than written again:
        a second identical put would reach every watcher as a second event.
        """
        info = await self._link.client.get_lease_info(self._lease_id, keys=True)
        if info.TTL <= 0:
            self._link.report("lease_lost", f"lease {self._lease_id:x} not found")
            self._lease_lost()
            return
        attached = {key.decode() for key in info.keys}
        unknown = attached - (self._written.keys() - self._in_doubt)
        held = await self._held(unknown)
        self._written = {full: self._written[full] for full in attached - unknown} | held
        self._in_doubt.clear()
        self._audit = False
        for full in self._dirty | self._written.keys() | self._desired.keys():
            self._mark(full)

    async def _held(self, keys: set[str]) -> dict[str, str]:
        """The values etcd holds under our lease for `keys`, read in transactions (linearizable)."""
        ops = self._link.client.transactions
        wanted = sorted(keys)
        held: dict[str, str] = {}
        for start in range(0, len(wanted), MAX_TXN_OPS):
            gets = [ops.get(full.encode()) for full in wanted[start : start + MAX_TXN_OPS]]
            _, replies = await self._link.client.transaction(compare=[], success=gets, failure=[])
            for value, kv in (found for reply in replies for found in reply):
                if kv.lease == self._lease_id:
                    held[kv.key.decode()] = value.decode()
        return held

    def _lease_lost(self) -> None:
        """Every key went with the lease: all desired keys are pending again."""
        if self._lease_id is not None:
            log.warning(
                "etcd: lease %x of %s is gone; re-granting and re-publishing", self._lease_id, self.host
            )
        self._lease_id = None
        self._audit = False
        self._written.clear()
        self._in_doubt.clear()
        self._dirty = set(self._desired)

    async def _flush(self) -> None:
        """Write one batch of differing keys in a single transaction.

        A write etcd will never take (a value over its request size limit) is dropped from the
        pending set and reported as "rejected", so that it cannot block every later write.
        """
        batch = self._next_batch()
        ops = self._link.client.transactions
        self._in_doubt = set(batch)  # until etcd answers
        try:
            await self._link.client.transaction(
                compare=[],
                failure=[],
                success=[
                    ops.delete(full.encode())
                    if value is None
                    else ops.put(full.encode(), value.encode(), self._lease_id)
                    for full, value in batch.items()
                ],
            )
        except aetcd.ClientError as exc:
            if len(batch) > 1 or not _too_large(exc):
                raise
            (full,) = batch
            self._dirty.discard(full)
            self._link.report("rejected", f"{full}: {one_line(exc)}")
            return
        self._in_doubt.clear()
        for full, value in batch.items():
            if value is None:
                self._written.pop(full, None)
            else:
                self._written[full] = value
            self._mark(full)

    def _next_batch(self) -> dict[str, str | None]:
        """Dirty keys for one transaction, within etcd's default limits on operations and bytes."""
        batch: dict[str, str | None] = {}
        size = 0
        for full in self._dirty:
            value = self._desired.get(full)
            cost = len(full.encode()) + len((value or "").encode())
            if batch and (len(batch) == MAX_TXN_OPS or size + cost > MAX_TXN_BYTES):
                break
            batch[full] = value
            size += cost
        return batch

    # ---- lookups and watches --------------------------------------------------------------------

    async def lookup(self, key: str, wait: float = 0.0) -> str | None:
        """A peer's mapping as an agent's lookup asks for it: waiting up to `wait` s for it to appear.

        Peers' QP and MR mappings come from the cache (registry_cache.py): the first lookup of a peer
        NIC reads its mappings and follows them with one watch, the later ones cost etcd nothing. A key
        the cache lacks with no wait is read from etcd itself, so "not published" stays exact.
        RegistryUnavailable as for `get` and `wait_for`.
        """
        own = self._full(key)
        group = self.cache.group(key) if own not in self._dirty else None
        if group is None:
            return await (self.wait_for(key, wait) if wait > 0 else self.get(key))
        try:
            value = await group.answer(key, wait, self._link.timeout)
        except TimeoutError:
            raise RegistryUnavailable(
                f"etcd at {self._link.describe()} unreachable while reading {key}"
            ) from None
        if value is not None:
            return value
        if wait <= 0:
            return await self.get(key)  # rare (a peer without a backup): etcd's own word on it
        if not self.connected:
            raise RegistryUnavailable(f"etcd at {self._link.describe()} unreachable while waiting for {key}")
        return None

    async def get(self, key: str) -> str | None:
        """The value of `key` (relative), or None; RegistryUnavailable if etcd does not answer in time.

        A key of our own with a write still pending answers as etcd will hold it: an agent that withdrew
        a mapping must not find it again through the same daemon (read your own writes).
        """
        if (own := self._full(key)) in self._dirty:
            return self._desired.get(own)
        full = own.encode()
        _, kvs = await self._link.snapshot(full, full + b"\0")
        return kvs[0].value.decode() if kvs else None

    async def wait_for(self, key: str, timeout: float) -> str | None:
        """The value of `key` once it exists; None if it did not appear within `timeout`.

        Raises RegistryUnavailable instead when etcd could not be reached at the end of the wait,
        so that "not published" and "cannot tell" stay distinct.
        """
        full = self._full(key).encode()
        events = watch_range(self._link, full, full + b"\0", len(self.prefix), resync=True)
        try:
            async with asyncio.timeout(timeout):
                async for event in events:
                    if event.type == PUT:
                        return event.value
        except TimeoutError:
            pass
        finally:
            await events.aclose()
        if not self.connected:
            raise RegistryUnavailable(f"etcd at {self._link.describe()} unreachable while waiting for {key}")
        return None

    def watch_prefix(
        self, prefix: str, start_revision: int | None = None, resync: bool = False
    ) -> AsyncIterator[WatchEvent]:
        """Events under `prefix` (relative) from now, or from `start_revision`, or (`resync`) the keys there
        are first; resumes across outages."""
        full = (self.prefix + prefix).encode()
        return watch_range(self._link, full, prefix_range_end(full), len(self.prefix), start_revision, resync)


def _too_large(exc: aetcd.ClientError) -> bool:
    """etcd refused the request for its size (its own check, or gRPC's message limit above it)."""
    return isinstance(exc, aetcd.InvalidArgumentError) or "larger than max" in str(exc)
