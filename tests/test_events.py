"""The event bus: sequence numbers, backlog, fan-out, and dropping a subscriber that lags."""

import asyncio

import pytest

from libshift.api.shift.v1 import admin_pb2
from shiftd import events
from shiftd.events import EventBus, SubscriberOverflow


def fault(device):
    return admin_pb2.Event(fault=admin_pb2.FaultChange(device=device, mode=1))


def test_backlog_and_fanout():
    async def scenario():
        bus = EventBus("h0", backlog=3)
        first, second = bus.subscribe(), bus.subscribe()
        for i in range(5):
            bus.publish(fault(f"d{i}"))
        got = [await anext(aiter(first)) for _ in range(5)]
        second.close()
        return bus, got

    bus, got = asyncio.run(scenario())
    assert [e.seq for e in got] == [1, 2, 3, 4, 5]
    assert all(e.host == "h0" and e.time_unix_nanos > 0 for e in got)
    assert [e.fault.device for e in bus.recent(10)] == ["d2", "d3", "d4"]
    assert bus.recent(0) == []


def test_lagging_subscriber_is_dropped(monkeypatch):
    monkeypatch.setattr(events, "SUBSCRIBER_QUEUE", 4)

    async def scenario():
        bus = EventBus("h0")
        slow = bus.subscribe()
        for i in range(10):
            bus.publish(fault(f"d{i}"))
        received = []
        with pytest.raises(SubscriberOverflow):
            async for event in slow:
                received.append(event.seq)
        return received, slow.overflowed, len(bus._subscribers)

    received, overflowed, remaining = asyncio.run(scenario())
    assert overflowed
    assert remaining == 0
    assert received == [2, 3, 4]  # the oldest made room for the overflow marker
