"""shiftd's gRPC services (grpc.aio): Agent for the libshift agents, Admin for operators.

Handlers are thin: they find out who is calling (through the SO_PEERCRED relay), check it,
and call the daemon. Every refusal is a proper status code with a one-line message.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf import json_format, message_factory
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError

from libshift.api.shift.v1 import admin_pb2, admin_pb2_grpc, agent_pb2, agent_pb2_grpc, common_pb2
from shiftd.agents import RefusedRequest, mr_key, qp_key
from shiftd.daemon_view import DaemonView
from shiftd.events import EventBus, StreamWriter, SubscriberOverflow
from shiftd.fault_spec import Fault, FaultSpecError
from shiftd.nic import FaultMode
from shiftd.nics import UnknownDevice
from shiftd.peercred import PeerCred
from shiftd.registry import RegistryUnavailable

log = logging.getLogger(__name__)
MAX_WAIT_SECONDS = 60.0


def _code(name: str) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, name)


def unary(admin: bool = False) -> Callable:
    """Wrap a unary handler: identify and authorize the caller, map errors, count the call."""

    def decorate(handler: Callable) -> Callable:
        @functools.wraps(handler)
        async def wrapper(self: _Base, request: Any, context: grpc.aio.ServicerContext) -> Any:
            method = handler.__name__
            cred = self._caller(context, admin)
            if cred is None:
                self._count(method, "PERMISSION_DENIED")
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, self._denied_message(context))
            try:
                reply = await handler(self, request, context, cred)
            except RefusedRequest as exc:
                self._count(method, exc.code)
                await context.abort(_code(exc.code), str(exc))
            except UnknownDevice as exc:
                self._count(method, "NOT_FOUND")
                known = ", ".join(self.daemon.devices) or "none"
                await context.abort(
                    grpc.StatusCode.NOT_FOUND, f"unknown device {exc.args[0]!r} (known: {known})"
                )
            except RegistryUnavailable as exc:
                self._count(method, "UNAVAILABLE")
                await context.abort(grpc.StatusCode.UNAVAILABLE, f"etcd is unreachable: {exc}")
            self._count(method, "OK")
            return reply

        return wrapper

    return decorate


class _Base:
    def __init__(self, daemon: DaemonView) -> None:
        self.daemon = daemon

    def _caller(self, context: grpc.aio.ServicerContext, admin: bool) -> PeerCred | None:
        cred = self.daemon.caller(context.peer())
        if cred is None:
            return None
        if admin and not self.daemon.is_admin(cred):
            return None
        return cred

    def _denied_message(self, context: grpc.aio.ServicerContext) -> str:
        if self.daemon.caller(context.peer()) is None:
            return "caller unknown: connect through shiftd's socket"
        return f"admin calls need root or membership of group {self.daemon.admin_group!r}"

    def _count(self, method: str, code: str) -> None:
        self.daemon.count_request(method, code)


class AgentService(_Base, agent_pb2_grpc.AgentServicer):
    @unary()
    async def Register(self, request, context, cred):
        paths = request.paths if request.HasField("paths") else None
        info = self.daemon.agents.register(
            context.peer(), cred, request.pid, request.name, request.job, paths
        )
        self.daemon.count_dropped(info.agent_id, cred, request.instance, request.reports_dropped)
        return agent_pb2.RegisterResponse(
            agent_id=info.agent_id, host=self.daemon.host, nics=self.daemon.nic_protos()
        )

    @unary()
    async def Unregister(self, request, context, cred):
        self.daemon.agents.unregister(request.agent_id, cred)
        return agent_pb2.UnregisterResponse()

    async def WatchNicEvents(self, request, context) -> None:
        cred = self._caller(context, admin=False)
        if cred is None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, self._denied_message(context))
        if request.agent_id and request.agent_id not in self.daemon.agents.agents:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no agent {request.agent_id!r} is registered")
        snapshot = [self.daemon.snapshot_event(nic).SerializeToString() for nic in self.daemon.nic_protos()]
        snapshot += [event.SerializeToString() for event in self.daemon.peer_nics.down()]
        await _follow(self.daemon.bus, context, snapshot, nic_only=True)

    @unary()
    async def Publish(self, request, context, cred):
        self.daemon.admit_publish(context.peer(), len(request.qps) + len(request.mrs))
        self.daemon.agents.publish(request.agent_id, cred, request.qps, request.mrs)
        pending = self.daemon.pending_writes
        return agent_pb2.PublishResponse(stored=pending == 0, pending=pending)

    @unary()
    async def Withdraw(self, request, context, cred):
        self.daemon.agents.withdraw(request.agent_id, cred, request.qps, request.mrs)
        return agent_pb2.WithdrawResponse()

    @unary()
    async def LookupQp(self, request, context, cred):
        mapping = await self._lookup(
            qp_key, request.gid, request.qpn, request.wait_seconds, common_pb2.QpMapping
        )
        return agent_pb2.LookupQpResponse(mapping=mapping)

    @unary()
    async def LookupMr(self, request, context, cred):
        mapping = await self._lookup(
            mr_key, request.gid, request.rkey, request.wait_seconds, common_pb2.MrMapping
        )
        return agent_pb2.LookupMrResponse(mapping=mapping)

    async def _lookup(
        self, make_key: Callable[[str, int], str], gid: str, number: int, wait: float, kind: type
    ):
        """A peer's published mapping, waiting up to `wait` s for it; NOT_FOUND when there is none."""
        try:
            key = make_key(gid, number)
        except ValueError:
            raise RefusedRequest("INVALID_ARGUMENT", f"gid: {gid[:64]!r} is not a GID (IPv6 text)") from None
        value = await self.daemon.lookup(key, _wait(wait))
        if value is None:
            raise RefusedRequest("NOT_FOUND", f"no backup published for {key}")
        return _decode(value, kind())

    @unary()
    async def ReportFailover(self, request, context, cred):
        reports = [request.report, *request.more]
        paths = request.paths if request.HasField("paths") else None
        counted = 0
        for i, report in enumerate(reports):
            seq = request.seq + i if request.seq else 0
            last = i == len(reports) - 1  # where the QPs run now: after the request's last switch
            if self.daemon.agents.record_switch(
                request.agent_id, cred, report, request.instance, seq, paths if last else None
            ):
                self.daemon.record_failover(report)
                counted += 1
        self.daemon.count_dropped(request.agent_id, cred, request.instance, request.reports_dropped)
        return agent_pb2.ReportFailoverResponse(duplicate=not counted)


class AdminService(_Base, admin_pb2_grpc.AdminServicer):
    @unary(admin=True)
    async def Status(self, request, context, cred):
        return self.daemon.status()

    @unary(admin=True)
    async def ListNics(self, request, context, cred):
        return admin_pb2.ListNicsResponse(nics=self.daemon.nic_protos())

    @unary(admin=True)
    async def FailNic(self, request, context, cred):
        if request.mode not in FaultMode._value2member_map_:
            raise RefusedRequest("INVALID_ARGUMENT", f"unknown fault mode {request.mode}")
        try:
            fault = Fault(
                FaultMode(request.mode) or FaultMode.DOWN,
                request.flap_period_seconds or None,
                request.loss_percent,
                request.rate_bits_per_second,
            )
        except FaultSpecError as exc:
            raise RefusedRequest("INVALID_ARGUMENT", str(exc)) from None
        nic = await self.daemon.fail_nic(request.device, fault, by_uid=cred.uid)
        return admin_pb2.FailNicResponse(nic=nic)

    @unary(admin=True)
    async def RecoverNic(self, request, context, cred):
        return admin_pb2.RecoverNicResponse(
            nic=await self.daemon.recover_nic(request.device, by_uid=cred.uid)
        )

    async def StreamEvents(self, request, context) -> None:
        if self._caller(context, admin=True) is None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, self._denied_message(context))
        backlog = [e.SerializeToString() for e in self.daemon.bus.recent(min(request.backlog, 10000))]
        if request.follow:
            await _follow(self.daemon.bus, context, backlog, nic_only=False)
        else:
            for data in backlog:
                await context.write(data)


async def _follow(
    bus: EventBus, context: grpc.aio.ServicerContext, first: list[bytes], nic_only: bool
) -> None:
    """Stream `first`, then the bus's events as they are published, until the client leaves.

    The bus calls the writer from publish() itself, so a NIC event is on its way to the
    subscriber before the monitor's callback returns (no queue, no task in between).
    """
    writer = StreamWriter(context.write)
    for data in first:
        writer.deliver(data)
    bus.subscribe(writer.deliver, nic_only)
    try:
        await writer.wait_broken()
    except SubscriberOverflow:
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "event stream fell behind; resubscribe")
    finally:
        bus.unsubscribe(writer.deliver)
        writer.close()


def _wait(seconds: float) -> float:
    if not seconds >= 0:  # also rejects NaN
        raise RefusedRequest("INVALID_ARGUMENT", "wait_seconds must not be negative")
    return min(seconds, MAX_WAIT_SECONDS)


def _decode(value: str, message):
    try:
        return json_format.Parse(value, message, ignore_unknown_fields=True)
    except json_format.ParseError:
        raise RefusedRequest("DATA_LOSS", "the stored mapping is not readable") from None


def strict_handlers(servicer: object, service: ServiceDescriptor) -> grpc.GenericRpcHandler:
    """Handlers that parse requests themselves, so malformed bytes get INVALID_ARGUMENT.

    With the generated add_*_to_server, a request that fails to parse ends as UNKNOWN with a
    Python exception name in the message; a client deserves a proper status. Streams write
    bytes serialized by their handlers (an event is serialized once for all its subscribers).
    """
    handlers = {}
    for method in service.methods:
        request_cls = message_factory.GetMessageClass(method.input_type)
        response_cls = message_factory.GetMessageClass(method.output_type)
        handler = _parsed(getattr(servicer, method.name), request_cls)
        if method.server_streaming:
            handlers[method.name] = grpc.unary_stream_rpc_method_handler(handler)
        else:
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                handler, response_serializer=response_cls.SerializeToString
            )
    return grpc.method_handlers_generic_handler(service.full_name, handlers)


async def _parse(request_cls: type, raw: bytes, context: grpc.aio.ServicerContext) -> Any:
    try:
        return request_cls.FromString(raw)
    except DecodeError:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed {request_cls.DESCRIPTOR.name}")


def _parsed(impl: Callable, request_cls: type) -> Callable:
    async def handler(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        return await impl(await _parse(request_cls, raw, context), context)

    return handler


async def start_grpc(daemon: DaemonView, private_path: str, limit: int) -> grpc.aio.Server:
    """Start the gRPC server on the private socket behind the relay; requests of at most `limit` bytes."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", 16 * limit),
            ("grpc.so_reuseport", 0),
        ]
    )
    server.add_generic_rpc_handlers(
        (
            strict_handlers(AgentService(daemon), agent_pb2.DESCRIPTOR.services_by_name["Agent"]),
            strict_handlers(AdminService(daemon), admin_pb2.DESCRIPTOR.services_by_name["Admin"]),
        )
    )
    server.add_insecure_port(f"unix:{private_path}")
    await server.start()
    os.chmod(private_path, 0o600)
    return server
