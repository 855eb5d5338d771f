"""The daemon's event bus: NIC changes, faults, agent changes and failover reports.

Every event gets a sequence number and lands in a bounded backlog (for `shiftctl events`)
and in the queue of every subscriber (agent NIC streams, followed admin streams). A
subscriber that falls too far behind is dropped rather than allowed to grow without bound.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator

from libshift.api.shift.v1 import admin_pb2

SUBSCRIBER_QUEUE = 4096


class SubscriberOverflow(Exception):
    """The subscriber did not keep up and lost events."""


class Subscription:
    def __init__(self, bus: EventBus) -> None:
        self._bus = bus
        self._queue: asyncio.Queue[admin_pb2.Event | None] = asyncio.Queue(SUBSCRIBER_QUEUE)
        self.overflowed = False

    def _offer(self, event: admin_pb2.Event) -> None:
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            self.overflowed = True
            self._bus.unsubscribe(self)
            self._queue.get_nowait()
            self._queue.put_nowait(None)

    def close(self) -> None:
        self._bus.unsubscribe(self)

    def __aiter__(self) -> AsyncIterator[admin_pb2.Event]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[admin_pb2.Event]:
        while True:
            event = await self._queue.get()
            if event is None:
                raise SubscriberOverflow
            yield event


class EventBus:
    def __init__(self, host: str, backlog: int = 1000) -> None:
        self.host = host
        self._backlog: collections.deque[admin_pb2.Event] = collections.deque(maxlen=backlog)
        self._subscribers: set[Subscription] = set()
        self._seq = 0

    def publish(self, event: admin_pb2.Event) -> admin_pb2.Event:
        """Stamp the event (seq, host, time when unset) and hand it to everyone."""
        self._seq += 1
        event.seq = self._seq
        event.host = self.host
        if not event.time_unix_nanos:
            event.time_unix_nanos = time.time_ns()
        self._backlog.append(event)
        for subscriber in list(self._subscribers):
            subscriber._offer(event)
        return event

    def recent(self, count: int) -> list[admin_pb2.Event]:
        if count <= 0:
            return []
        return list(self._backlog)[-count:]

    def subscribe(self) -> Subscription:
        subscription = Subscription(self)
        self._subscribers.add(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        self._subscribers.discard(subscription)
