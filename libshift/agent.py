"""The in-process agent: libshift's gRPC client of the local shiftd.

It registers the process, follows the daemon's NIC events on a background thread, publishes
this process's `default -> backup` mappings and looks up the peers'. shiftd may restart
(systemd's Restart=on-failure): the agent then reconnects with backoff, registers again and
re-publishes everything it holds, so the mappings outlive the daemon's restart. Without a
reachable shiftd, `Agent.connect` returns None and says why once; the caller runs without
failover.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import grpc.experimental

from libshift.api.shift.v1 import agent_pb2, agent_pb2_grpc, common_pb2
from libshift.notices import NicChange, NicState, SwitchKind, SwitchReport
from libshift.verbs import Endpoint

log = logging.getLogger("libshift.agent")

DEFAULT_SOCKET = "/run/shift/shiftd.sock"
CALL_TIMEOUT = 5.0
MAPPINGS_PER_CALL = 4096  # shiftd refuses larger Publish calls (shiftd.agents.MAX_MAPPINGS_PER_CALL)
RECONNECT_INITIAL = 0.05
RECONNECT_MAX = 2.0

NicListener = Callable[[NicChange], None]
NIC_STATES = {
    common_pb2.NIC_STATE_UP: NicState.UP,
    common_pb2.NIC_STATE_DOWN: NicState.DOWN,
    common_pb2.NIC_STATE_DEGRADED: NicState.DEGRADED,
}
KINDS = {
    SwitchKind.FAILOVER: common_pb2.FAILOVER_KIND_FAILOVER,
    SwitchKind.FAILBACK: common_pb2.FAILOVER_KIND_FAILBACK,
}


class AgentError(RuntimeError):
    """shiftd refused or could not answer a call; str() says which and why."""


def socket_path() -> str:
    return os.environ.get("SHIFT_SOCKET", DEFAULT_SOCKET)


def to_proto(endpoint: Endpoint) -> common_pb2.Endpoint:
    """Provider data values are JSON-encoded: the proto map holds strings, ports are ints."""
    return common_pb2.Endpoint(
        gid=endpoint.gid,
        qpn=endpoint.qpn,
        psn=endpoint.psn,
        device=endpoint.device,
        provider=endpoint.provider,
        provider_data={k: json.dumps(v) for k, v in endpoint.provider_data.items()},
    )


def from_proto(message: common_pb2.Endpoint) -> Endpoint:
    return Endpoint(
        gid=message.gid,
        qpn=message.qpn,
        psn=message.psn,
        device=message.device,
        provider=message.provider,
        provider_data={k: json.loads(v) for k, v in message.provider_data.items()},
    )


def nic_change(event: common_pb2.NicEvent) -> NicChange:
    """shiftd's NIC event as the library reads it (once per event, on the stream thread)."""
    return NicChange(
        device=event.device,
        state=NIC_STATES.get(event.state, NicState.UNKNOWN),
        reason=event.reason,
        monotonic_nanos=event.monotonic_nanos,
    )


def failover_report(report: SwitchReport) -> common_pb2.FailoverReport:
    """A QP's switch as shiftd takes it."""
    return common_pb2.FailoverReport(
        kind=KINDS[report.kind],
        device=report.device,
        backup_device=report.backup_device,
        default_device=report.default_device,
        reason=report.reason,
        downtime_seconds=report.downtime_seconds,
        reposted_work_requests=report.reposted_work_requests,
        qps=report.qps,
        time_unix_nanos=report.time_unix_nanos,
    )


CHANNEL_OPTIONS = [
    # A connection of its own: shiftd ties the registration (and its mappings) to the connection,
    # which gRPC would otherwise share with any other channel of the process.
    ("grpc.use_local_subchannel_pool", 1),
    # The NIC event stream is read on the agent's own event thread instead of being handed over from
    # gRPC's: one thread hop less between shiftd's write and the failover (~0.15 ms).
    (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1),
]


@dataclass(frozen=True)
class MrBackup:
    """A memory region's backup key, as a peer looks it up by the key it already knows."""

    gid: str
    rkey: int
    backup_gid: str
    backup_rkey: int


class Agent:
    """One per process. Thread-safe; listeners run on the agent's event thread: keep them short."""

    def __init__(self, socket: str, name: str, job: str) -> None:
        self.socket = socket
        self.name = name
        self.job = job
        self._lock = threading.Lock()
        self._channel = grpc.insecure_channel(f"unix:{socket}", options=CHANNEL_OPTIONS)
        self._stub = agent_pb2_grpc.AgentStub(self._channel)
        self._agent_id = ""
        self.host = ""
        self._nics: dict[str, NicChange] = {}
        self._listeners: list[NicListener] = []
        self._qps: dict[tuple[str, int], common_pb2.QpMapping] = {}
        self._mrs: dict[tuple[str, int], common_pb2.MrMapping] = {}
        self._closed = threading.Event()
        self._registered = threading.Event()
        self._thread: threading.Thread | None = None
        self._stream: grpc.Future | None = None
        self.reconnects = 0

    # ---- lifecycle ----------------------------------------------------------------------------

    @classmethod
    def connect(cls, socket: str | None = None, name: str | None = None, job: str = "") -> Agent | None:
        """Register with the local shiftd, or return None (logged once) when there is none."""
        path = socket or socket_path()
        if not os.path.exists(path):
            log.warning("no shiftd socket at %s: running without failover (set SHIFT_SOCKET)", path)
            return None
        agent = cls(path, name or os.path.basename(sys.argv[0] or "python"), job)
        try:
            agent._register()
        except AgentError as exc:
            log.warning("shiftd at %s not usable (%s): running without failover", path, exc)
            agent._channel.close()
            return None
        agent._start_events()
        return agent

    def close(self) -> None:
        """Unregister (the daemon withdraws our mappings) and stop the event thread."""
        if self._closed.is_set():
            return
        self._closed.set()
        # on failure the daemon withdraws our mappings anyway when the connection closes
        with contextlib.suppress(grpc.RpcError):
            self._stub.Unregister(agent_pb2.UnregisterRequest(agent_id=self._agent_id), timeout=1.0)
        if self._stream is not None:
            self._stream.cancel()
        self._channel.close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def agent_id(self) -> str:
        return self._agent_id

    # ---- NIC events ---------------------------------------------------------------------------

    def add_listener(self, listener: NicListener) -> None:
        """Call `listener` for every NIC event from now on (after the current states)."""
        with self._lock:
            self._listeners.append(listener)
            current = list(self._nics.values())
        for event in current:
            listener(event)

    def remove_listener(self, listener: NicListener) -> None:
        with self._lock:
            self._listeners.remove(listener)

    def nic_state(self, device: str) -> NicState:
        """The latest state the daemon reported for `device` (UNKNOWN before its first word)."""
        with self._lock:
            change = self._nics.get(device)
        return change.state if change else NicState.UNKNOWN

    # ---- mappings -----------------------------------------------------------------------------

    def publish_qp(self, primary: Endpoint, backup: Endpoint) -> None:
        mapping = common_pb2.QpMapping(primary=to_proto(primary), backup=to_proto(backup))
        with self._lock:
            self._qps[(primary.gid, primary.qpn)] = mapping
        self._call("Publish", agent_pb2.PublishRequest(agent_id=self._agent_id, qps=[mapping]))

    def publish_mr(self, gid: str, rkey: int, backup_gid: str, backup_rkey: int) -> None:
        mapping = common_pb2.MrMapping(gid=gid, rkey=rkey, backup_gid=backup_gid, backup_rkey=backup_rkey)
        with self._lock:
            self._mrs[(gid, rkey)] = mapping
        self._call("Publish", agent_pb2.PublishRequest(agent_id=self._agent_id, mrs=[mapping]))

    def withdraw_qp(self, primary: Endpoint) -> None:
        with self._lock:
            mapping = self._qps.pop((primary.gid, primary.qpn), None)
        if mapping is not None:
            self._call("Withdraw", agent_pb2.WithdrawRequest(agent_id=self._agent_id, qps=[mapping.primary]))

    def withdraw_mr(self, gid: str, rkey: int) -> None:
        with self._lock:
            mapping = self._mrs.pop((gid, rkey), None)
        if mapping is not None:
            self._call("Withdraw", agent_pb2.WithdrawRequest(agent_id=self._agent_id, mrs=[mapping]))

    def lookup_qp(self, gid: str, qpn: int, wait: float = 0.0) -> Endpoint | None:
        """The backup of the peer QP (gid, qpn), waiting up to `wait` s for it to be published."""
        request = agent_pb2.LookupQpRequest(gid=gid, qpn=qpn, wait_seconds=wait)
        reply = self._call("LookupQp", request, timeout=wait + CALL_TIMEOUT, missing_ok=True)
        return from_proto(reply.mapping.backup) if reply is not None else None

    def lookup_mr(self, gid: str, rkey: int, wait: float = 0.0) -> MrBackup | None:
        request = agent_pb2.LookupMrRequest(gid=gid, rkey=rkey, wait_seconds=wait)
        reply = self._call("LookupMr", request, timeout=wait + CALL_TIMEOUT, missing_ok=True)
        if reply is None:
            return None
        m = reply.mapping
        return MrBackup(m.gid, m.rkey, m.backup_gid, m.backup_rkey)

    def report(self, report: SwitchReport) -> None:
        """Tell shiftd about a failover or failback (for metrics and `shiftctl events`); never raises."""
        request = agent_pb2.ReportFailoverRequest(agent_id=self._agent_id, report=failover_report(report))
        try:
            self._call("ReportFailover", request)
        except AgentError as exc:
            log.warning("could not report a %s to shiftd: %s", report.kind.value, exc)

    # ---- internals ----------------------------------------------------------------------------

    def _call(self, method: str, request, timeout: float = CALL_TIMEOUT, missing_ok: bool = False):
        try:
            return getattr(self._stub, method)(request, timeout=timeout)
        except grpc.RpcError as exc:
            if missing_ok and exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise AgentError(f"{method}: {exc.code().name}: {exc.details()}") from None

    def _register(self) -> None:
        request = agent_pb2.RegisterRequest(pid=os.getpid(), name=self.name[:200], job=self.job[:200])
        try:
            reply = self._stub.Register(request, timeout=CALL_TIMEOUT, wait_for_ready=False)
        except grpc.RpcError as exc:
            raise AgentError(f"Register: {exc.code().name}: {exc.details()}") from None
        self._agent_id, self.host = reply.agent_id, reply.host
        with self._lock:
            qps, mrs = list(self._qps.values()), list(self._mrs.values())
        # a restarted daemon knows nothing of us: publish everything again, as many calls as it takes
        for start in range(0, len(qps), MAPPINGS_PER_CALL):
            chunk = qps[start : start + MAPPINGS_PER_CALL]
            self._call("Publish", agent_pb2.PublishRequest(agent_id=self._agent_id, qps=chunk))
        for start in range(0, len(mrs), MAPPINGS_PER_CALL):
            chunk = mrs[start : start + MAPPINGS_PER_CALL]
            self._call("Publish", agent_pb2.PublishRequest(agent_id=self._agent_id, mrs=chunk))
        self._registered.set()

    def _start_events(self) -> None:
        self._thread = threading.Thread(target=self._follow_events, name="libshift-agent", daemon=True)
        self._thread.start()

    def _follow_events(self) -> None:
        """Follow the NIC event stream; on a broken stream, reconnect, re-register, re-publish."""
        backoff = RECONNECT_INITIAL
        while not self._closed.is_set():
            try:
                self._stream = self._stub.WatchNicEvents(
                    agent_pb2.WatchNicEventsRequest(agent_id=self._agent_id)
                )
                for event in self._stream:
                    backoff = RECONNECT_INITIAL
                    self._deliver(event)
            except grpc.RpcError as exc:
                if self._closed.is_set():
                    return
                log.warning("shiftd event stream broke (%s); reconnecting", exc.code().name)
            while not self._closed.is_set():
                time.sleep(backoff)
                backoff = min(backoff * 2, RECONNECT_MAX)
                try:
                    self._register()
                    self.reconnects += 1
                    log.info("re-registered with shiftd as %s", self._agent_id)
                    break
                except AgentError:
                    continue

    def _deliver(self, event: common_pb2.NicEvent) -> None:
        """Straight to the listeners, on the stream's thread: a NIC DOWN is the fastest detection."""
        change = nic_change(event)
        with self._lock:
            self._nics[change.device] = change
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(change)
            except Exception:  # a listener's bug must not kill the event thread
                log.exception("NIC event listener failed")
