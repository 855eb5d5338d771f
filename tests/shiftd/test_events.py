"""The event bus (sequence numbers, backlog, fan-out, agents first) and the stream writer
(in order, one write at a time, the first one started inside publish, a lagging subscriber dropped)."""

import asyncio

import pytest

from libshift.api.shift.v1 import admin_pb2, common_pb2
from shiftd import events
from shiftd.events import EventBus, StreamWriter, SubscriberOverflow


def fault(device):
    return admin_pb2.Event(fault=admin_pb2.FaultChange(device=device, mode=1))


def nic(device):
    return admin_pb2.Event(nic=common_pb2.NicEvent(device=device, state=2))


def test_backlog_and_fanout():
    bus = EventBus("h0", backlog=3)
    first, second = [], []
    bus.subscribe(first.append)
    bus.subscribe(second.append)
    for i in range(5):
        bus.publish(fault(f"d{i}"))
    bus.unsubscribe(second.append)
    bus.publish(fault("d5"))
    got = [admin_pb2.Event.FromString(data) for data in first]
    assert [e.seq for e in got] == [1, 2, 3, 4, 5, 6]
    assert all(e.host == "h0" and e.time_unix_nanos > 0 for e in got)
    assert len(second) == 5
    assert [e.fault.device for e in bus.recent(10)] == ["d3", "d4", "d5"]
    assert bus.recent(0) == []


def test_agents_hear_nic_events_only_and_first():
    bus = EventBus("h0")
    heard = []
    bus.subscribe(lambda data: heard.append(("admin", admin_pb2.Event.FromString(data).seq)))
    bus.subscribe(
        lambda data: heard.append(("agent", common_pb2.NicEvent.FromString(data).device)), nic_only=True
    )
    bus.publish(fault("d0"))
    bus.publish(nic("mlx5_0"))
    assert heard == [("admin", 1), ("agent", "mlx5_0"), ("admin", 2)]


class Stream:
    """The shape of grpc.aio's context.write: a coroutine that waits for its write to complete."""

    def __init__(self) -> None:
        self.started: list[bytes] = []  # writes handed over, in order
        self.pending: list[asyncio.Future[None]] = []

    async def write(self, data: bytes) -> None:
        self.started.append(data)
        done = asyncio.get_running_loop().create_future()
        self.pending.append(done)
        await done

    def complete(self, exc: BaseException | None = None) -> None:
        done = self.pending.pop(0)
        if exc is None:
            done.set_result(None)
        else:
            done.set_exception(exc)


def test_writer_starts_an_idle_write_at_once_and_keeps_order():
    async def scenario():
        stream = Stream()
        writer = StreamWriter(stream.write)
        writer.deliver(b"a")
        at_once = list(stream.started)  # no await yet: written inside deliver()
        writer.deliver(b"b")
        writer.deliver(b"c")
        queued = list(stream.started)  # one write in flight at a time
        for _ in range(3):
            stream.complete()
            await asyncio.sleep(0)  # the future's callbacks run on the loop
        writer.close()
        await writer.wait_broken()  # closed, not broken: returns
        return at_once, queued, stream.started

    at_once, queued, started = asyncio.run(scenario())
    assert at_once == [b"a"]
    assert queued == [b"a"]
    assert started == [b"a", b"b", b"c"]


def test_a_failed_write_breaks_the_stream_and_later_messages_are_dropped():
    async def scenario():
        stream = Stream()
        writer = StreamWriter(stream.write)
        writer.deliver(b"a")
        writer.deliver(b"b")
        stream.complete(ConnectionResetError("client gone"))
        with pytest.raises(ConnectionResetError):
            await writer.wait_broken()
        writer.deliver(b"c")
        return stream.started

    assert asyncio.run(scenario()) == [b"a"]


def test_lagging_subscriber_is_dropped(monkeypatch):
    monkeypatch.setattr(events, "SUBSCRIBER_QUEUE", 4)

    async def scenario():
        bus = EventBus("h0")
        stream = Stream()
        writer = StreamWriter(stream.write)
        bus.subscribe(writer.deliver)
        for i in range(10):
            bus.publish(fault(f"d{i}"))  # one in flight, four queued, then the sixth overflows
        with pytest.raises(SubscriberOverflow):
            await writer.wait_broken()
        bus.unsubscribe(writer.deliver)
        stream.complete()
        await asyncio.sleep(0)
        return [admin_pb2.Event.FromString(data).seq for data in stream.started]

    assert asyncio.run(scenario()) == [1]  # the queue went with the subscriber
