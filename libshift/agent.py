"""The in-process agent: libshift's gRPC client of the local shiftd.

It registers the process, follows the daemon's NIC events on a background thread, publishes
this process's `default -> backup` mappings and looks up the peers'. A restart of shiftd (a crash,
an upgrade) loses nothing:
- back at once: systemd's shiftd.socket (or the lab's supervisor) holds the socket across the restart,
  so the agent's re-register (which waits for the channel to be ready) goes through the moment the new
  daemon serves; with no socket held, gRPC reconnects on the agent's backoff while shiftd stays down;
- nothing missed: the agent registers again with where its QPs run (the path sources), re-publishes
  everything it holds, and the event stream starts with every NIC's state, which goes to the listeners
  like any event (a NIC that failed or came back meanwhile is acted on);
- nothing lost: failover reports wait in a bounded queue (libshift/reportqueue.py) until shiftd
  acknowledges them, and are sent again after a reconnect under the same id, which shiftd counts once.
With no shiftd socket at all, `Agent.connect` returns None and says why once (the caller runs without
failover); with a socket nobody answers, it returns an agent that catches up when shiftd appears.

Long on purpose: one client object, whose registration, mappings, event stream and reports share one
channel, one lock and one registration state; the report queue itself is reportqueue.py.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import grpc
import grpc.experimental

from libshift.api.shift.v1 import agent_pb2, agent_pb2_grpc, common_pb2
from libshift.notices import NicChange, NicState, SwitchKind, SwitchReport
from libshift.published import gid_key, published_mrs, published_qps
from libshift.reportqueue import ReportQueue
from libshift.verbs import Endpoint

log = logging.getLogger("libshift.agent")

DEFAULT_SOCKET = "/run/shift/shiftd.sock"
CALL_TIMEOUT = 5.0
MAPPINGS_PER_CALL = 4096  # shiftd refuses larger Publish calls (shiftd.agents.MAX_MAPPINGS_PER_CALL)
RECONNECT_INITIAL = 0.05
RECONNECT_MAX = 2.0
FIRST_REGISTER_WAIT = 10.0  # connect waits this long for a daemon coming back on a held socket
REPORT_RETRY = 0.1  # a report shiftd did not take is tried again this soon (or after the next register)
REPORTS_PER_CALL = 256  # a storm of switches: each call carries this many reports at most
REPORT_FLUSH = 2.0  # close waits this long for the reports still queued
REPORT_SETTLE = 0.02  # the first report of a burst waits this long: the failover it reports is still
# finishing (the peer's count, the replay), and the call's serializing would hold the interpreter lock then
# a report call that ended so is tried again: shiftd is away, or does not know us yet; others refuse it
REPORT_AGAIN = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)

NicListener = Callable[[NicChange], None]
# (default device, device now in use) -> how many QPs: where a context's QPs run now
PathCounts = Mapping[tuple[str, str], int]
PathSource = Callable[[], PathCounts]
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
        host=event.host,
        gid=event.gid,
        move_off=event.move_off,
        previous_gid=event.previous_gid,
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
    # A re-register waits for gRPC's own reconnects (see Agent._reconnect), so their backoff is the agent's
    # schedule while shiftd stays down: ours, not gRPC's default (1 s, growing to 2 min). A connection that
    # sits in a held socket's backlog is given up after gRPC's min connect timeout (20 s); the next follows.
    ("grpc.initial_reconnect_backoff_ms", int(RECONNECT_INITIAL * 1000)),
    ("grpc.max_reconnect_backoff_ms", int(RECONNECT_MAX * 1000)),
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
        self._peer_listeners: list[NicListener] = []
        self._peer_nics: dict[str, NicChange] = {}  # by GID: peer hosts' NICs that are not UP
        self._qps = published_qps()
        self._mrs = published_mrs()
        self._path_sources: list[PathSource] = []
        self._closed = threading.Event()
        self._registered = threading.Event()
        self._thread: threading.Thread | None = None
        self._reporter: threading.Thread | None = None
        self._stream: grpc.Future | None = None
        self.reconnects = 0
        self.instance = secrets.token_hex(8)  # the reports' id outlives our registrations with a daemon
        self.reports: ReportQueue[common_pb2.FailoverReport] = ReportQueue()

    # ---- lifecycle ----------------------------------------------------------------------------

    @classmethod
    def connect(cls, socket: str | None = None, name: str | None = None, job: str = "") -> Agent | None:
        """Register with the local shiftd; None (logged once) when the host has no shiftd socket.

        A daemon coming back on a held socket is waited for (FIRST_REGISTER_WAIT); one that does not
        answer leaves an agent that registers when it does: QPs published before then are published
        then, lookups fail until then."""
        path = socket or socket_path()
        if not os.path.exists(path):
            log.warning("no shiftd socket at %s: running without failover (set SHIFT_SOCKET)", path)
            return None
        agent = cls(path, name or os.path.basename(sys.argv[0] or "python"), job)
        try:
            agent._register(FIRST_REGISTER_WAIT)
        except AgentError as exc:
            log.warning("shiftd at %s not answering (%s): registering when it does", path, exc)
        agent._start_threads()
        return agent

    def close(self) -> None:
        """Send the reports still queued (briefly), unregister (the daemon withdraws our mappings), and
        stop the threads."""
        if self._closed.is_set():
            return
        if self._registered.is_set():
            self.reports.wait_empty(REPORT_FLUSH)
        self._closed.set()
        self.reports.close()
        # on failure the daemon withdraws our mappings anyway when the connection closes
        with contextlib.suppress(grpc.RpcError):
            self._stub.Unregister(agent_pb2.UnregisterRequest(agent_id=self._agent_id), timeout=1.0)
        if self._stream is not None:
            self._stream.cancel()
        self._channel.close()
        for thread in (self._thread, self._reporter):
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=5)

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def agent_id(self) -> str:
        return self._agent_id

    @property
    def registered(self) -> bool:
        """Whether shiftd knows this agent now (false while it is away)."""
        return self._registered.is_set()

    # ---- where our QPs run (told at every register and report) -----------------------------------

    def add_path_source(self, source: PathSource) -> None:
        with self._lock:
            self._path_sources.append(source)

    def remove_path_source(self, source: PathSource) -> None:
        with self._lock:
            self._path_sources.remove(source)

    def _paths(self) -> common_pb2.QpPaths:
        """Every source's count, summed; asked outside our lock (a source takes its context's)."""
        with self._lock:
            sources = list(self._path_sources)
        total: Counter[tuple[str, str]] = Counter()
        for source in sources:
            total.update(source())
        return common_pb2.QpPaths(
            paths=[common_pb2.QpPath(default_device=d, device=on, qps=n) for (d, on), n in total.items()]
        )

    # ---- NIC events ---------------------------------------------------------------------------

    def add_listener(self, listener: NicListener, peers: bool = False) -> None:
        """Call `listener` for every event of this host's NICs from now on (after their current states); with
        `peers`, for every event of peer hosts' NICs instead (shiftd follows their records in etcd)."""
        with self._lock:
            (self._peer_listeners if peers else self._listeners).append(listener)
            current = list(self._peer_nics.values() if peers else self._nics.values())
        for event in current:
            listener(event)

    def remove_listener(self, listener: NicListener) -> None:
        with self._lock:
            for listeners in (self._listeners, self._peer_listeners):
                if listener in listeners:
                    listeners.remove(listener)

    def nic_state(self, device: str) -> NicState:
        """The latest state the daemon reported for `device` (UNKNOWN before its first word)."""
        change = self.nic(device)
        return change.state if change else NicState.UNKNOWN

    def nic(self, device: str) -> NicChange | None:
        """The daemon's latest word on this host's `device` (state and reason)."""
        with self._lock:
            return self._nics.get(device)

    def peer_nic(self, gid: str) -> NicChange | None:
        """The daemon's latest word on the peer host's NIC of `gid` if it is not UP; None while it is (or
        while nothing is known of it)."""
        with self._lock:
            return self._peer_nics.get(gid)

    # ---- mappings -----------------------------------------------------------------------------

    def publish_qp(self, primary: Endpoint, backup: Endpoint) -> None:
        mapping = common_pb2.QpMapping(primary=to_proto(primary), backup=to_proto(backup))
        with self._lock:
            self._qps.put(mapping)
        if self._registered.is_set():  # else the register publishes it
            self._call("Publish", agent_pb2.PublishRequest(agent_id=self._agent_id, qps=[mapping]))

    def publish_mr(self, gid: str, rkey: int, backup_gid: str, backup_rkey: int) -> None:
        mapping = common_pb2.MrMapping(gid=gid, rkey=rkey, backup_gid=backup_gid, backup_rkey=backup_rkey)
        with self._lock:
            self._mrs.put(mapping)
        if self._registered.is_set():
            self._call("Publish", agent_pb2.PublishRequest(agent_id=self._agent_id, mrs=[mapping]))

    def withdraw_qp(self, primary: Endpoint) -> None:
        with self._lock:
            mappings = self._qps.pop((gid_key(primary.gid), primary.qpn))
        if mappings and self._registered.is_set():
            ends = [m.primary for m in mappings]
            self._call("Withdraw", agent_pb2.WithdrawRequest(agent_id=self._agent_id, qps=ends))

    def withdraw_mr(self, gid: str, rkey: int) -> None:
        with self._lock:
            mappings = self._mrs.pop((gid_key(gid), rkey))
        if mappings and self._registered.is_set():
            self._call("Withdraw", agent_pb2.WithdrawRequest(agent_id=self._agent_id, mrs=mappings))

    def _readdressed(self, old: str, new: str) -> None:
        """Our NIC's GID `old` is `new` now (shiftd's word): our mappings follow it (published.py)."""
        with self._lock:
            qps, mrs = self._qps.readdress(old, new), self._mrs.readdress(old, new)
            registered = self._registered.is_set()  # else the register publishes them
        log.info(
            "our GID %s is %s now: %d QP and %d MR mappings published for it", old, new, len(qps), len(mrs)
        )
        if registered:
            self._publish_all(qps, mrs)

    def lookup_qp(self, gid: str, qpn: int, wait: float = 0.0) -> Endpoint | None:
        """The backup of the peer QP (gid, qpn), waiting up to `wait` s for it to be published."""
        self._check_registered("LookupQp")
        request = agent_pb2.LookupQpRequest(gid=gid, qpn=qpn, wait_seconds=wait)
        reply = self._call("LookupQp", request, timeout=wait + CALL_TIMEOUT, missing_ok=True)
        return from_proto(reply.mapping.backup) if reply is not None else None

    def lookup_mr(self, gid: str, rkey: int, wait: float = 0.0) -> MrBackup | None:
        self._check_registered("LookupMr")
        request = agent_pb2.LookupMrRequest(gid=gid, rkey=rkey, wait_seconds=wait)
        reply = self._call("LookupMr", request, timeout=wait + CALL_TIMEOUT, missing_ok=True)
        if reply is None:
            return None
        m = reply.mapping
        return MrBackup(m.gid, m.rkey, m.backup_gid, m.backup_rkey)

    def report(self, report: SwitchReport) -> None:
        """Tell shiftd about a failover or failback (for metrics and `shiftctl events`): queued, never
        blocks, never raises; sent by the reporter thread until shiftd has it (see the module's note)."""
        self.reports.put(failover_report(report))

    # ---- internals ----------------------------------------------------------------------------

    def _call(self, method: str, request, timeout: float = CALL_TIMEOUT, missing_ok: bool = False):
        try:
            return getattr(self._stub, method)(request, timeout=timeout)
        except grpc.RpcError as exc:
            if missing_ok and exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise AgentError(f"{method}: {exc.code().name}: {exc.details()}") from None

    def _check_registered(self, method: str) -> None:
        if not self._registered.is_set():
            raise AgentError(f"{method}: not registered with shiftd (it is away)")

    def _register(self, timeout: float = CALL_TIMEOUT, wait_for_ready: bool = False) -> None:
        request = agent_pb2.RegisterRequest(
            pid=os.getpid(),
            name=self.name[:200],
            job=self.job[:200],
            paths=self._paths(),
            instance=self.instance,
            reports_dropped=self.reports.dropped,
        )
        try:
            reply = self._stub.Register(request, timeout=timeout, wait_for_ready=wait_for_ready)
        except grpc.RpcError as exc:
            raise AgentError(f"Register: {exc.code().name}: {exc.details()}") from None
        with self._lock:  # a mapping published from now on is sent by its publisher, one before by us
            self._agent_id, self.host = reply.agent_id, reply.host
            self._registered.set()
            qps, mrs = self._qps.values(), self._mrs.values()
        # a restarted daemon knows nothing of us: publish everything again
        self._publish_all(qps, mrs)

    def _publish_all(self, qps: list[common_pb2.QpMapping], mrs: list[common_pb2.MrMapping]) -> None:
        """Publish these, as many calls as it takes."""
        for start in range(0, len(qps), MAPPINGS_PER_CALL):
            chunk = qps[start : start + MAPPINGS_PER_CALL]
            self._call("Publish", agent_pb2.PublishRequest(agent_id=self._agent_id, qps=chunk))
        for start in range(0, len(mrs), MAPPINGS_PER_CALL):
            chunk = mrs[start : start + MAPPINGS_PER_CALL]
            self._call("Publish", agent_pb2.PublishRequest(agent_id=self._agent_id, mrs=chunk))

    def _start_threads(self) -> None:
        self._thread = threading.Thread(target=self._follow_events, name="libshift-agent", daemon=True)
        self._reporter = threading.Thread(target=self._send_reports, name="libshift-reports", daemon=True)
        self._thread.start()
        self._reporter.start()

    def _follow_events(self) -> None:
        """Follow the NIC event stream; on a broken stream (or none yet), register again and follow anew."""
        while not self._closed.is_set():
            if not self._registered.is_set():
                again = bool(self._agent_id)
                if not self._reconnect():
                    return
                if again:
                    self.reconnects += 1
                    log.info("re-registered with shiftd as %s", self._agent_id)
            with self._lock:  # the stream's first events say again which peers' NICs are down
                self._peer_nics.clear()
            try:
                self._stream = self._stub.WatchNicEvents(
                    agent_pb2.WatchNicEventsRequest(agent_id=self._agent_id)
                )
                for event in self._stream:  # every NIC's state first: what changed while we were away
                    self._deliver(event)
            except grpc.RpcError as exc:
                if self._closed.is_set():
                    return
                log.warning("shiftd event stream broke (%s); reconnecting", exc.code().name)
            self._registered.clear()

    def _reconnect(self) -> bool:
        """Register again, as soon as the channel is up; whether it worked (not closed).

        The call waits for the channel to be ready: gRPC reconnects on its own (into a held socket's
        backlog, answered the moment the new daemon serves; or, with no socket held, on its backoff). A
        call that fails fast instead, in TRANSIENT_FAILURE (a connection given up after 20 s in the
        backlog), would leave the re-register to our backoff, grown meanwhile: 0.2-0.9 s late, measured.
        An attempt that waited until its deadline was the pause already: the next follows at once; only
        one that failed fast (shiftd refused it) backs off. (The request, with our paths and drop count,
        is as they were when its wait began: a switch since then has its report queued, which follows
        the register with the paths and count of then.)"""
        delay = RECONNECT_INITIAL
        while not self._closed.is_set():
            started = time.monotonic()
            try:
                self._register(wait_for_ready=True)
                return True
            except AgentError:
                pass
            if self._closed.wait(max(0.0, delay - (time.monotonic() - started))):
                return False
            delay = min(delay * 2, RECONNECT_MAX)
        return False

    def _send_reports(self) -> None:
        """Send the queued reports in order, each until shiftd answers; a report that shiftd did not take
        (it is away) waits for the next registration and goes again, under its id."""
        sent = 0.0  # when the last report went
        while self.reports.oldest():
            if time.monotonic() - sent > REPORT_SETTLE:
                self._closed.wait(REPORT_SETTLE)  # cut short by close(): what is queued goes at once
            if not self._registered.wait(REPORT_RETRY):
                continue
            batch = self.reports.oldest(REPORTS_PER_CALL)
            if not batch:
                continue  # closed meanwhile
            (seq, report), last = batch[0], batch[-1][0]
            # where every QP runs, with the last report of a burst only: shiftd counts the others' moves from
            # the reports themselves, and asking every context for its QPs' paths once per report cost a
            # storm of 1,000 switches a million QP visits under the contexts' locks
            paths = self._paths() if self.reports.last(last) else None
            request = agent_pb2.ReportFailoverRequest(
                agent_id=self._agent_id,
                report=report,
                more=[later for _, later in batch[1:]],
                instance=self.instance,
                seq=seq,
                paths=paths,
                reports_dropped=self.reports.dropped,
            )
            try:
                self._stub.ReportFailover(request, timeout=CALL_TIMEOUT)
            except grpc.RpcError as exc:
                if exc.code() in REPORT_AGAIN:
                    log.info("report %d not taken by shiftd (%s); sending it again", seq, exc.code().name)
                    self._closed.wait(REPORT_RETRY)
                    continue
                log.warning("shiftd refused a report: %s: %s", exc.code().name, exc.details())
            self.reports.ack(last)
            sent = time.monotonic()

    def _deliver(self, event: common_pb2.NicEvent) -> None:
        """Straight to the listeners, on the stream's thread: a NIC DOWN is the fastest detection."""
        change = nic_change(event)
        with self._lock:
            peer = bool(change.host) and change.host != self.host
            if peer:
                if change.previous_gid:  # re-addressed: the old GID is gone
                    self._peer_nics.pop(change.previous_gid, None)
                if change.state is NicState.UP:
                    self._peer_nics.pop(change.gid, None)
                else:
                    self._peer_nics[change.gid] = change
                listeners = list(self._peer_listeners)
            else:
                self._nics[change.device] = change
                listeners = list(self._listeners)
        if change.previous_gid and not peer:
            self._readdressed(change.previous_gid, change.gid)
        for listener in listeners:
            try:
                listener(change)
            except Exception:  # a listener's bug must not kill the event thread
                log.exception("NIC event listener failed")
