"""The event stream path over real gRPC (grpc.aio on a Unix socket): what the daemon's
WatchNicEvents and StreamEvents do after their checks, with events published on the server's loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from libshift.api.shift.v1 import admin_pb2, agent_pb2, agent_pb2_grpc, common_pb2
from shiftd import events, server
from shiftd.events import EventBus


def nic(device: str) -> admin_pb2.Event:
    return admin_pb2.Event(nic=common_pb2.NicEvent(device=device, state=2))


@contextlib.asynccontextmanager
async def watching(tmp_path: Path, bus: EventBus) -> AsyncIterator[grpc.aio.UnaryStreamCall]:
    """A server whose WatchNicEvents follows `bus` after a one-event snapshot, and a call to it."""

    async def watch(raw: bytes, context: grpc.aio.ServicerContext) -> None:
        snapshot = [common_pb2.NicEvent(device="snapshot").SerializeToString()]
        await server._follow(bus, context, snapshot, nic_only=True)

    grpc_server = grpc.aio.server()
    handlers = {"WatchNicEvents": grpc.unary_stream_rpc_method_handler(watch)}
    grpc_server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("shift.v1.Agent", handlers),))
    grpc_server.add_insecure_port(f"unix:{tmp_path}/grpc.sock")
    await grpc_server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix:{tmp_path}/grpc.sock") as channel:
            call = agent_pb2_grpc.AgentStub(channel).WatchNicEvents(agent_pb2.WatchNicEventsRequest())
            assert (await call.read()).device == "snapshot"
            yield call
    finally:
        await grpc_server.stop(None)


def test_a_burst_arrives_whole_and_in_order(tmp_path: Path) -> None:
    async def scenario() -> list[str]:
        bus = EventBus("h0")
        async with watching(tmp_path, bus) as call:
            for i in range(50):
                bus.publish(nic(f"d{i}"))  # one write in flight, the rest queued behind it
            return [(await call.read()).device for _ in range(50)]

    assert asyncio.run(scenario()) == [f"d{i}" for i in range(50)]


def test_a_subscriber_that_falls_behind_gets_resource_exhausted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events, "SUBSCRIBER_QUEUE", 4)

    async def scenario() -> tuple[list[str], grpc.StatusCode, int]:
        bus = EventBus("h0")
        async with watching(tmp_path, bus) as call:
            for i in range(20):
                bus.publish(nic(f"d{i}"))
            received = []
            with pytest.raises(grpc.aio.AioRpcError) as error:
                while True:
                    received.append((await call.read()).device)
            return received, error.value.code(), len(bus._nic_subscribers)

    received, code, subscribers = asyncio.run(scenario())
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert received == [f"d{i}" for i in range(len(received))]  # what came, came in order
    assert len(received) <= 5  # one in flight and four queued at most
    assert subscribers == 0


def test_a_client_that_leaves_is_unsubscribed(tmp_path: Path) -> None:
    async def scenario() -> int:
        bus = EventBus("h0")
        async with watching(tmp_path, bus) as call:
            call.cancel()
            for _ in range(200):  # the server hears of the cancellation through the core
                if not bus._nic_subscribers:
                    break
                await asyncio.sleep(0.01)
            bus.publish(nic("after"))  # nobody to write to, and publish must not fail
            return len(bus._nic_subscribers)

    assert asyncio.run(scenario()) == 0
