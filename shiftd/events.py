"""The daemon's event bus (NIC changes, faults, agent changes, failover reports) and the writer
that carries them onto a subscriber's stream.

Every event gets a sequence number and lands in a bounded backlog (for `shiftctl events`), and
goes to every subscriber as bytes, serialized once however many subscribers there are. Agent
streams subscribe to NIC events only and hear them first: they are the ones that fail over, and
each stream write costs event-loop time that later subscribers wait behind. Admin streams
(followed `shiftctl events`) hear every event after them.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Coroutine
from typing import Any

from libshift.api.shift.v1 import admin_pb2, common_pb2

SUBSCRIBER_QUEUE = 4096  # messages a subscriber may have waiting before it is dropped

Deliver = Callable[[bytes], None]


class SubscriberOverflow(Exception):
    """The subscriber did not keep up and lost events."""


class EventBus:
    def __init__(self, host: str, backlog: int = 1000) -> None:
        self.host = host
        self._backlog: collections.deque[admin_pb2.Event] = collections.deque(maxlen=backlog)
        self._nic_subscribers: dict[Deliver, None] = {}  # insertion-ordered sets
        self._subscribers: dict[Deliver, None] = {}
        self._seq = 0

    def publish(self, event: admin_pb2.Event) -> admin_pb2.Event:
        """Stamp the event (seq, host, time when unset) and hand it to everyone, agents first."""
        self._seq += 1
        event.seq = self._seq
        event.host = self.host
        if not event.time_unix_nanos:
            event.time_unix_nanos = time.time_ns()
        self._backlog.append(event)
        if self._nic_subscribers and event.HasField("nic"):
            _deliver(self._nic_subscribers, event.nic.SerializeToString())
        if self._subscribers:
            _deliver(self._subscribers, event.SerializeToString())
        return event

    def tell_agents(self, nic: common_pb2.NicEvent) -> None:
        """A peer host's NIC event: to the agents' streams only (the backlog and `shiftctl events` are this
        host's own)."""
        if self._nic_subscribers:
            _deliver(self._nic_subscribers, nic.SerializeToString())

    def recent(self, count: int) -> list[admin_pb2.Event]:
        if count <= 0:
            return []
        return list(self._backlog)[-count:]

    def subscribe(self, deliver: Deliver, nic_only: bool = False) -> None:
        """Call `deliver` with every event from now on: a serialized `NicEvent` of each NIC
        event when `nic_only`, else every serialized `Event`. It runs inside publish(): keep it short."""
        (self._nic_subscribers if nic_only else self._subscribers)[deliver] = None

    def unsubscribe(self, deliver: Deliver) -> None:
        self._nic_subscribers.pop(deliver, None)
        self._subscribers.pop(deliver, None)


def _deliver(subscribers: dict[Deliver, None], data: bytes) -> None:
    for deliver in list(subscribers):  # a subscriber may leave while we deliver
        deliver(data)


class StreamWriter:
    """Carries serialized messages onto one stream (a grpc.aio server stream), in order, one
    write in flight at a time.

    A message that finds the stream idle is written from inside `deliver`, not from a task:
    grpc.aio's write() hands the bytes to the C core on its first step, so taking that step
    here spares the NIC event an event-loop turn and the task switches of an async generator
    (Python 3.11 has no eager tasks). A write in flight resumes from its future's callback,
    as a task would. Messages that come meanwhile wait in a bounded queue; a subscriber that
    lets it fill is dropped (SubscriberOverflow), never allowed to grow the daemon.
    """

    def __init__(self, write: Callable[[bytes], Coroutine[Any, Any, None]]) -> None:
        self._write = write
        self._queue: collections.deque[bytes] = collections.deque()
        self._writing: Coroutine[Any, Any, None] | None = None
        self._ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def deliver(self, data: bytes) -> None:
        if self._ended.done():
            return
        if self._writing is None:
            self._start(data)
        elif len(self._queue) < SUBSCRIBER_QUEUE:
            self._queue.append(data)
        else:
            self._end(SubscriberOverflow())

    async def wait_broken(self) -> None:
        """Wait while the stream works; raises the error that broke it, or SubscriberOverflow."""
        await self._ended

    def close(self) -> None:
        """Write nothing more (a write in flight finishes or fails on its own)."""
        self._queue.clear()
        if not self._ended.done():
            self._ended.set_result(None)

    def _start(self, data: bytes) -> None:
        self._writing = self._write(data)
        self._step()

    def _step(self, _: object = None) -> None:
        """Run the write until it waits on a future (its completion) or ends; then the next."""
        assert self._writing is not None
        try:
            awaited = self._writing.send(None)
        except StopIteration:
            self._writing = None
            if self._queue and not self._ended.done():
                self._start(self._queue.popleft())
            return
        except (Exception, asyncio.CancelledError) as exc:  # the stream broke (client gone, server stopping)
            self._writing = None
            self._end(exc)
            return
        if not asyncio.isfuture(awaited):
            self._writing.close()
            self._writing = None
            self._end(TypeError(f"a stream write awaited {awaited!r}; only futures are supported"))
            return
        awaited.add_done_callback(self._step)

    def _end(self, exc: BaseException) -> None:
        self._queue.clear()
        if not self._ended.done():
            self._ended.set_exception(exc)
