"""Watches that outlive etcd: resume after a broken stream, resync after compaction or a wipe.

aetcd's watcher ends a watch for good when its stream breaks, so this module speaks etcd's Watch
RPC directly (one stream per watch) and keeps the one piece of state that makes a resume exact:
the revision after the last event delivered, or, before any event, after the revision the watch
was created at (a "from now" watch that resumed "from now" would lose what was written while
it was cut off).

Rules:
- stream broken (etcd restarted, member killed), or no "created" within the link's timeout: re-watch
  from last revision + 1, after backoff;
- revision compacted, or the store went back in time or changed cluster (etcd restarted from an
  empty data dir): read the whole range, emit DELETE for keys seen before that are gone and PUT for
  every key present (the current state), then watch from the read's revision + 1.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import NamedTuple

import aetcd
import grpc
from aetcd import rpc

from shiftd.registry_conn import EtcdLink, RegistryUnavailable

log = logging.getLogger("shiftd.registry")

PUT = "PUT"
DELETE = "DELETE"


class WatchEvent(NamedTuple):
    type: str  # PUT or DELETE
    key: str  # relative to the registry's prefix
    value: str | None  # None for DELETE
    revision: int


class _Resync(Exception):
    """The watch cannot resume from its revision: read the current state instead."""


class _StreamEnded(aetcd.ClientError):
    """etcd closed or cancelled the watch stream without an error status."""


async def watch_range(
    link: EtcdLink,
    key: bytes,
    range_end: bytes,
    strip: int,
    start_revision: int | None = None,
    resync: bool = False,
    on_synced: Callable[[], None] | None = None,
) -> AsyncIterator[WatchEvent]:
    """Events on [key, range_end) until the registry stops; keys lose their first `strip` bytes.

    With `resync` the iterator starts with the current state (a get followed by a watch, with no
    gap between them); with `start_revision` it starts at that revision. `on_synced` is called
    each time the events so far add up to the whole current state (after each such read).
    """
    next_rev = start_revision
    present: set[bytes] = set()  # keys whose last emitted event was a PUT
    cluster_id: int | None = None
    backoff = link.backoff()
    cut_off = False  # the stream broke since the watch was last created: say when it is back
    while not link.closed.is_set():
        try:
            if resync:
                revision, kvs = await link.snapshot(key, range_end)
                now = {kv.key: kv for kv in kvs}
                for gone in sorted(present - now.keys()):
                    yield WatchEvent(DELETE, gone[strip:].decode(), None, revision)
                for kv in kvs:
                    yield WatchEvent(PUT, kv.key[strip:].decode(), kv.value.decode(), kv.mod_revision)
                present, next_rev, resync = set(now), revision + 1, False
                if on_synced is not None:
                    on_synced()
            stub = await link.watch_stub()
            call = stub.Watch()
            try:
                create = rpc.WatchCreateRequest(key=key, range_end=range_end, start_revision=next_rev or 0)
                # A stream opened while the channel reconnects can hang without an error: until etcd
                # says the watch is created, each step has the link's timeout, then the stream starts over.
                await asyncio.wait_for(call.write(rpc.WatchRequest(create_request=create)), link.timeout)
                created = False
                while True:
                    resp = await (call.read() if created else asyncio.wait_for(call.read(), link.timeout))
                    if resp is grpc.aio.EOF:
                        raise _StreamEnded("etcd closed the watch stream")
                    if resp.compact_revision:
                        raise _Resync(
                            f"revision {next_rev} compacted (compacted up to {resp.compact_revision})"
                        )
                    if resp.canceled:
                        raise _StreamEnded(f"etcd cancelled the watch: {resp.cancel_reason}")
                    if resp.created:
                        if cluster_id not in (None, resp.header.cluster_id) or (
                            next_rev is not None and resp.header.revision + 1 < next_rev
                        ):
                            raise _Resync(f"store at revision {resp.header.revision} is behind this watch")
                        if next_rev is None:
                            # "From now" means from this revision on, also after a reconnect:
                            # etcd starts such a watch right after the created header's revision.
                            next_rev = resp.header.revision + 1
                        cluster_id = resp.header.cluster_id
                        created = True
                        if cut_off:
                            log.info("etcd watch on %r: resumed from revision %d", key.decode(), next_rev)
                            cut_off = False
                        backoff.reset()
                        link.ok()
                    for event in resp.events:
                        kv = event.kv
                        next_rev = kv.mod_revision + 1
                        if event.type == rpc.Event.PUT:
                            present.add(kv.key)
                            yield WatchEvent(PUT, kv.key[strip:].decode(), kv.value.decode(), kv.mod_revision)
                        else:
                            present.discard(kv.key)
                            yield WatchEvent(DELETE, kv.key[strip:].decode(), None, kv.mod_revision)
            finally:
                call.cancel()
        except _Resync as why:
            log.info("etcd watch on %r: %s; resyncing", key.decode(), why)
            cluster_id, resync = None, True
        except asyncio.CancelledError:
            # Closing the channel in stop() cancels our calls: end quietly, unless the
            # consumer's own task is the one being cancelled.
            task = asyncio.current_task()
            if link.closed.is_set() and not (task and task.cancelling()):
                return
            raise
        except RegistryUnavailable:  # the resync's read, already counted
            cut_off = True
            await link.sleep(backoff.next())
        except Exception as exc:
            if link.closed.is_set():
                return
            cut_off = True
            link.failed(exc)
            await link.sleep(backoff.next())
