"""`shiftd`: the per-host daemon. Wires inventory, monitors, health, faults, etcd, gRPC, metrics.

Everything runs on one asyncio loop. The order of start and stop matters: monitors first
(so the first answer already knows the links), then etcd (never waited for), metrics, the
gRPC server behind the SO_PEERCRED relay, and READY for systemd last; SIGTERM undoes it in
reverse, revoking the etcd lease so this host's keys vanish at once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

from libshift.api.shift.v1 import admin_pb2, common_pb2
from shiftd import __version__, inventory, monitors
from shiftd import config as config_mod
from shiftd.agents import AgentTable, RefusedRequest, encode
from shiftd.events import EventBus
from shiftd.fault_spec import Fault
from shiftd.faults import FaultInjector
from shiftd.health import Transition
from shiftd.listenfds import ListenError, inherited_socket
from shiftd.logthread import log_off_the_loop
from shiftd.metrics import Metrics
from shiftd.nic import FaultMode, NicState
from shiftd.nics import NicRecord, NicTable
from shiftd.peer_nics import PeerNics
from shiftd.peercred import PeerCred, PeerCredRelay, group_id
from shiftd.ratelimit import RateLimiter
from shiftd.registry import EtcdSecurity, Registry
from shiftd.sdnotify import Notifier
from shiftd.server import start_grpc
from shiftd.tasks import cancel_and_wait, supervised

log = logging.getLogger("shiftd")
SETTLE_SECONDS = 2.0
BOOKKEEPING_DELAY = 0.005  # after a NIC event, metrics and etcd wait until the agents have it


class StartupError(Exception):
    """The daemon cannot start; the message is the one line the operator sees."""


class Daemon:
    def __init__(self, config: config_mod.Config) -> None:
        self.config = config
        self.host = config.host
        self.started = time.monotonic()
        self.metrics = Metrics()
        self.bus = EventBus(self.host)
        self.notifier = Notifier()
        self.failovers = 0
        self.failbacks = 0
        self.serving_unix_nanos = 0  # when the socket began to be answered
        self.registry = Registry(
            config_mod.etcd_endpoints(config.etcd),
            self.host,
            prefix=config.etcd.prefix,
            lease_ttl=config.etcd.lease_ttl_seconds,
            timeout=config.etcd.timeout_seconds,
            retry_initial=config.etcd.retry_initial_seconds,
            retry_max=config.etcd.retry_max_seconds,
            on_error=lambda kind: self.metrics.etcd_errors.labels(kind).inc(),
            security=EtcdSecurity.from_config(config.etcd),
            spread=True,
        )
        try:
            specs = list(inventory.scan(config).nics)
        except inventory.InventoryError as exc:
            raise StartupError(str(exc)) from None
        self._hold_timer: asyncio.TimerHandle | None = None
        self.nics = NicTable(
            specs,
            config.health.hold_down_seconds,
            self._on_transition,
            self._rearm_hold_timer,
            on_readdressed=self._on_readdressed,
            damping=config.damping,
            loss=config.loss,
            slow=config.slow,
        )
        self.agents = AgentTable(self.registry, self._on_agent_change)
        self.peer_nics = PeerNics(self.registry, self.host, self._on_peer_nic)
        self.faults = FaultInjector(config.faults.flap_period_seconds)
        self.publish_limiter = RateLimiter(config.server.publish_rate, config.server.publish_burst)
        self.relay = PeerCredRelay(
            config.server.socket,
            "",
            config.server.socket_mode,
            config.server.socket_group,
            self._connection_closed,
        )
        self._admin_gid = group_id(config.server.admin_group)
        self._private_dir: Path | None = None
        self._grpc = None
        self._tasks: list[asyncio.Task] = []
        self._monitors = monitors.build(config.monitors, self.nics)
        self._export_metrics()

    @property
    def udev_description(self) -> str:
        udev = self._monitors.get("udev")  # it says what it watches: udev, or the kernel's uevents
        return getattr(udev, "description", "off (monitors.udev = false)")

    def _connection_closed(self, connection: str) -> None:
        self.agents.connection_closed(connection)
        self.publish_limiter.forget(connection)

    # --- what the services see (shiftd.daemon_view.DaemonView) ------------------------------------

    def is_admin(self, cred: PeerCred) -> bool:
        return cred.uid == 0 or (self._admin_gid is not None and cred.in_group(self._admin_gid))

    @property
    def admin_group(self) -> str:
        return self.config.server.admin_group

    @property
    def devices(self) -> list[str]:
        return self.nics.devices

    @property
    def pending_writes(self) -> int:
        return self.registry.pending

    def caller(self, connection: str) -> PeerCred | None:
        return self.relay.lookup(connection)

    def count_request(self, method: str, code: str) -> None:
        self.metrics.grpc_requests.labels(method, code).inc()

    def nic_protos(self) -> list[common_pb2.Nic]:
        return self.nics.all_protos()

    def admit_publish(self, connection: str, mappings: int) -> None:
        if not self.publish_limiter.take(connection, mappings):
            limit = self.config.server
            raise RefusedRequest(
                "RESOURCE_EXHAUSTED",
                f"publish rate limit: {limit.publish_rate:g} mappings/s, bursts of {limit.publish_burst}",
            )

    def status(self) -> admin_pb2.StatusResponse:
        return admin_pb2.StatusResponse(
            host=self.host,
            version=__version__,
            uptime_seconds=time.monotonic() - self.started,
            etcd_connected=self.registry.connected,
            etcd_endpoints=list(self.config.etcd.endpoints),
            lease_id=self.registry.lease_id or 0,
            pending_writes=self.registry.pending,
            nics=self.nics.all_protos(),
            agents=self.agents.infos(),
            failovers=self.failovers,
            failbacks=self.failbacks,
            socket=self.config.server.socket,
            metrics_address=self.metrics.address,
            udev=self.udev_description,
            serving_unix_nanos=self.serving_unix_nanos,
        )

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        try:  # socket activation: a socket held across restarts by systemd or the lab's supervisor
            held = inherited_socket(self.config.server.socket)
        except ListenError as exc:
            raise StartupError(f"server.socket: {exc}") from None
        if held is None:
            self._check_socket_free()  # (a held socket accepts whether a daemon serves it or not)
        await self._start_monitors()
        await self._await_first_states(SETTLE_SECONDS)
        await self.registry.start()
        self.registry.put(f"hosts/{self.host}", self._host_record())
        for nic in self.nics.all_protos():
            self.registry.put(f"nics/{self.host}/{nic.device}", encode(nic))
        self._tasks.append(asyncio.create_task(self.peer_nics.run(), name="peer-nics"))
        self._serve_metrics()
        self._prepare_private_dir()
        private_path = str(self._private_dir / "grpc.sock")
        self._grpc = await start_grpc(self, private_path, self.config.server.max_message_bytes)
        self.relay.private_path = private_path
        # serving: gRPC answers behind the relay from here on, and the relay's first accept comes inside
        # relay.start (asyncio yields to the loop as its server starts), so this is the moment, not after
        self.serving_unix_nanos = time.time_ns()
        try:
            await self.relay.start(held)
        except OSError as exc:  # e.g. no CAP_CHOWN for the socket's group, or a read-only /run
            raise StartupError(
                f"server.socket: cannot serve on {self.config.server.socket}: {exc.strerror}"
            ) from None
        self._rearm_hold_timer()
        if self.notifier.watchdog_interval:
            self._tasks.append(asyncio.create_task(self._watchdog(), name="watchdog"))
        self.notifier.ready(f"serving {len(self.nics.records)} NICs on {self.config.server.socket}")
        log.info(
            "serving %s on %s (NICs: %s; metrics: %s; udev: %s)",
            self.host,
            self.config.server.socket,
            ", ".join(f"{d}={self.nics.get(d).spec.netdev}" for d in self.nics.devices) or "none",
            self.metrics.address or "off",
            self.udev_description,
        )

    async def stop(self) -> None:
        self.notifier.stopping()
        await self.relay.close()
        if self._grpc is not None:
            await self._grpc.stop(grace=0.5)
        await cancel_and_wait(self._tasks)
        if self._hold_timer is not None:  # after the monitors, whose inputs set it again
            self._hold_timer.cancel()
        await self.faults.close()
        await self.registry.stop(revoke=True)
        self.metrics.close()
        if self._private_dir is not None:
            shutil.rmtree(self._private_dir, ignore_errors=True)
        log.info("stopped")

    def _check_socket_free(self) -> None:
        path = self.config.server.socket
        if not os.path.exists(path):
            return
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(path)
            except OSError:
                return  # a stale socket of a daemon that died; the relay replaces it
        raise StartupError(f"another shiftd is already serving on {path}")

    def _prepare_private_dir(self) -> None:
        parent = Path(self.config.server.socket).parent
        parent.mkdir(parents=True, exist_ok=True)
        for stale in parent.glob(".shiftd-grpc-*"):
            pid = stale.name.rsplit("-", 1)[-1]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                shutil.rmtree(stale, ignore_errors=True)
        self._private_dir = parent / f".shiftd-grpc-{os.getpid()}"
        shutil.rmtree(self._private_dir, ignore_errors=True)
        self._private_dir.mkdir(mode=0o700)

    def _export_metrics(self) -> None:
        """Each NIC's series from the start, and the gauges that read the daemon's state at a scrape."""
        for record in self.nics.records.values():
            self.metrics.set_nic(record.name, record.spec.netdev, record.health.state)
            self.metrics.link_events.labels(record.name, record.spec.netdev)  # the series exists from 0
            self.metrics.flap_penalty.labels(record.name, record.spec.netdev).set_function(
                lambda name=record.name: self.nics.flap_penalty(name)
            )
            self.metrics.retransmits.labels(record.name, record.spec.netdev).set_function(
                lambda judge=record.health.loss: (
                    math.nan if judge.loss_percent is None else judge.loss_percent / 100
                )
            )
            self.metrics.speed.labels(record.name, record.spec.netdev).set_function(
                lambda judge=record.health.slow: math.nan if judge.rate is None else judge.rate / judge.best
            )
        self.metrics.etcd_up.set_function(lambda: 1 if self.registry.connected else 0)
        self.metrics.etcd_pending.set_function(lambda: self.registry.pending)
        self.metrics.agents.set_function(lambda: len(self.agents.agents))
        self.metrics.mappings.labels("qp").set_function(lambda: self.agents.mapping_counts()[0])
        self.metrics.mappings.labels("mr").set_function(lambda: self.agents.mapping_counts()[1])
        for device in self.nics.devices:
            self.metrics.backup_qps.labels(device).set_function(lambda d=device: self.agents.qps_on_backup(d))

    def _serve_metrics(self) -> None:
        listen = self.config.metrics.listen
        if not listen:
            return
        host, port = config_mod.parse_host_port("metrics.listen", listen)
        try:
            self.metrics.serve(host, port)
        except OSError as exc:
            raise StartupError(f"metrics.listen: cannot listen on {listen}: {exc.strerror}") from None

    async def _start_monitors(self) -> None:
        for name, monitor in self._monitors.items():
            task = supervised(f"monitor {name}", monitor.run)
            self._tasks.append(asyncio.create_task(task, name=name))

    async def _await_first_states(self, timeout: float) -> None:
        """Give the monitors' first dump a moment, so the first answers already know the links."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(r.health.state != NicState.UNSPECIFIED for r in self.nics.records.values()):
                return
            await asyncio.sleep(0.01)
        unknown = [name for name, r in self.nics.records.items() if r.health.state == NicState.UNSPECIFIED]
        log.warning("no state yet for %s after %.1fs; serving anyway", ", ".join(unknown), timeout)

    def _rearm_hold_timer(self) -> None:
        """Tick the health machines when the next hold-down or suppression ends (flap damping).

        A timer handle on the loop, set again after every input, rather than a task woken by
        an event: a NIC event then costs no task switch ahead of the agents' stream writes.
        The health machines' clock is time.monotonic, which is the loop's clock too.
        """
        if self._hold_timer is not None:
            self._hold_timer.cancel()
        deadline = self.nics.next_deadline()
        self._hold_timer = (
            None if deadline is None else asyncio.get_running_loop().call_at(deadline, self._tick)
        )

    def _tick(self) -> None:
        self._hold_timer = None
        self.nics.tick()
        self._rearm_hold_timer()

    async def _watchdog(self) -> None:
        assert self.notifier.watchdog_interval
        while True:
            self.notifier.watchdog()
            await asyncio.sleep(self.notifier.watchdog_interval)

    # --- what the services call ---------------------------------------------------------------

    def _nic_event(
        self, record: NicRecord, state: int, previous: int, reason: str, wall_ns: int
    ) -> admin_pb2.Event:
        """An event of one of this host's NICs, as the bus carries it."""
        event = admin_pb2.Event(time_unix_nanos=wall_ns)
        nic = event.nic  # filled in place: no copy of a NicEvent into the Event
        nic.host, nic.device, nic.netdev = self.host, record.name, record.spec.netdev
        nic.state, nic.previous_state, nic.reason = state, previous, reason
        nic.time_unix_nanos = wall_ns
        nic.move_off = self.nics.move_off(record.name)
        return event

    def _on_transition(self, record: NicRecord, transition: Transition) -> None:
        event = self._nic_event(
            record, transition.state, transition.previous, transition.reason, record.wall_last_change_ns
        )
        event.nic.monotonic_nanos = int(transition.at * 1e9)
        self.bus.publish(event)
        self.relay.pump()  # the agents' streams have written it to the relay: on to the agents now
        # Everything else waits until the subscribers' streams have taken the event: metrics, the
        # etcd record and the log cost ~0.5 ms of the event loop, which is half the latency budget.
        asyncio.get_running_loop().call_later(BOOKKEEPING_DELAY, self._after_transition, record, transition)

    def _after_transition(self, record: NicRecord, transition: Transition) -> None:
        spec = record.spec
        self.metrics.set_nic(record.name, spec.netdev, transition.state)
        self.metrics.nic_transitions.labels(
            record.name, transition.state.name.lower(), transition.reason
        ).inc()
        self._sync_link_events(record)
        self._publish_nic(record.name)
        level = logging.WARNING if transition.state != NicState.UP else logging.INFO
        log.log(level, "%s (%s): %s -> %s (%s)", record.name, spec.netdev, transition.previous.name,
                transition.state.name, transition.reason)  # fmt: skip

    def _on_readdressed(self, record: NicRecord, before: tuple[str, ...], replaced_gid: str) -> None:
        """A NIC's addresses changed, and with them its GID (a NIC back from repair with another address):
        the record in etcd, which peers read for its GID, is published again at once, state change or not.
        When a new GID replaced one, the agents hear it too (the state unchanged): they publish their
        mappings again under the new GID (libshift/agent.py)."""
        nic = self.nics.to_proto(record.name)
        log.warning("%s (%s): addresses %s -> %s, GID now %s: its record is published again", record.name,
                    record.spec.netdev, ", ".join(before) or "none", ", ".join(nic.addresses) or "none",
                    nic.gid or "none")  # fmt: skip
        self._publish_nic(record.name)
        if replaced_gid:
            event = self._nic_event(record, nic.state, nic.state, "readdressed", time.time_ns())
            event.nic.gid, event.nic.previous_gid = nic.gid, replaced_gid
            self.bus.publish(event)
            self.relay.pump()

    def _on_peer_nic(self, event: common_pb2.NicEvent) -> None:
        """A peer host's NIC changed (its shiftd's record in etcd): the agents judge their QPs to it."""
        self.bus.tell_agents(event)
        self.relay.pump()
        log.info("peer %s: %s (%s) %s (%s)", event.host, event.device, event.gid,
                 common_pb2.NicState.Name(event.state), event.reason)  # fmt: skip

    def _publish_nic(self, name: str) -> None:
        self.registry.put(f"nics/{self.host}/{name}", encode(self.nics.to_proto(name)))

    def _sync_link_events(self, record: NicRecord) -> None:
        """The health machine counts link flips; the counter catches up with what it has not seen yet."""
        missing = record.health.link_events - record.link_events_exported
        if missing > 0:
            self.metrics.link_events.labels(record.name, record.spec.netdev).inc(missing)
            record.link_events_exported = record.health.link_events

    def snapshot_event(self, nic: common_pb2.Nic) -> common_pb2.NicEvent:
        """The current state of a NIC, as the first events of an agent's stream."""
        return common_pb2.NicEvent(
            host=self.host,
            device=nic.device,
            netdev=nic.netdev,
            state=nic.state,
            previous_state=nic.state,
            reason=nic.reason or "snapshot",
            time_unix_nanos=nic.last_change_unix_nanos,
            move_off=self.nics.move_off(nic.device),
        )

    def _on_agent_change(self, info: common_pb2.AgentInfo, registered: bool) -> None:
        change = admin_pb2.AgentChange(agent=info, registered=registered)
        self.bus.publish(admin_pb2.Event(agent=change))
        log.info("agent %s (pid %d, %s) %s", info.agent_id, info.pid, info.name or "?",
                 "registered" if registered else "left")  # fmt: skip

    async def lookup(self, key: str, wait: float) -> str | None:
        return await self.registry.lookup(key, wait)

    def count_dropped(self, agent_id: str, cred: PeerCred, instance: str, dropped: int) -> None:
        """An agent's count of the reports it ever dropped, told with its register and every report."""
        self.metrics.reports_dropped.inc(self.agents.count_dropped(agent_id, cred, instance, dropped))

    def record_failover(self, report: common_pb2.FailoverReport) -> None:
        if report.kind == common_pb2.FAILOVER_KIND_FAILBACK:
            self.failbacks += 1
            self.metrics.failbacks.labels(report.device).inc()
        else:
            self.failovers += 1
            self.metrics.failovers.labels(report.device, report.reason or "unknown").inc()
            if report.downtime_seconds >= 0:
                self.metrics.downtime.observe(report.downtime_seconds)
        self.metrics.rewound.inc(report.reposted_work_requests)
        if not report.time_unix_nanos:
            report.time_unix_nanos = time.time_ns()
        self.bus.publish(admin_pb2.Event(failover=report))

    async def fail_nic(self, device: str, fault: Fault, by_uid: int) -> common_pb2.Nic:
        record = self.nics.get(device)
        previous = record.health.fault
        # Health first: the agents hear "operator_*" before the link drops, the fastest detection.
        self.nics.set_fault(device, fault.mode)
        try:
            await self.faults.apply(record.spec.netdev, fault)
        except Exception as exc:  # a netlink or tc failure: the operator must see why
            self.nics.set_fault(device, previous)
            raise RefusedRequest(
                "FAILED_PRECONDITION", f"cannot inject {fault.describe()} on {device}: {exc}"
            ) from exc
        self._publish_nic(device)
        self.metrics.faults.labels(device, fault.mode.name.lower()).inc()
        self.bus.publish(admin_pb2.Event(fault=admin_pb2.FaultChange(device=device, mode=int(fault.mode))))
        log.warning(
            "fault %s injected on %s (%s) by uid %d", fault.describe(), device, record.spec.netdev, by_uid
        )
        return self.nics.to_proto(device)

    async def recover_nic(self, device: str, by_uid: int) -> common_pb2.Nic:
        record = self.nics.get(device)
        try:
            await self.faults.clear(record.spec.netdev)
        except Exception as exc:
            raise RefusedRequest("FAILED_PRECONDITION", f"cannot recover {device}: {exc}") from exc
        self.nics.set_fault(device, FaultMode.NONE)
        self._publish_nic(device)
        self.bus.publish(admin_pb2.Event(fault=admin_pb2.FaultChange(device=device, mode=0)))
        log.warning("fault cleared on %s (%s) by uid %d", device, record.spec.netdev, by_uid)
        return self.nics.to_proto(device)

    def _host_record(self) -> str:
        return json.dumps(
            {
                "host": self.host,
                "version": __version__,
                "pid": os.getpid(),
                "socket": self.config.server.socket,
                "started_unix": int(time.time()),
                "devices": {d: self.nics.get(d).spec.netdev for d in self.nics.devices},
            },
            sort_keys=True,
        )


async def serve(config: config_mod.Config) -> None:
    daemon = Daemon(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await daemon.start()
        await stop.wait()
    finally:
        await daemon.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="shiftd",
        description="The SHIFT daemon: watches this host's RDMA NICs, tells libshift agents about failures "
        "over gRPC, publishes backup endpoints into etcd and exports Prometheus metrics.",
    )
    parser.add_argument(
        "--config", default=None, help=f"TOML config file (default {config_mod.DEFAULT_PATH})"
    )
    parser.add_argument("--check-config", action="store_true", help="validate the config file and exit")
    parser.add_argument("--log-level", choices=config_mod.LOG_LEVELS, help="override log_level of the config")
    parser.add_argument("--version", action="version", version=f"shiftd {__version__}")
    args = parser.parse_args(argv)
    try:
        config = config_mod.load(args.config)
    except config_mod.ConfigError as exc:
        print(f"shiftd: {exc}", file=sys.stderr)
        return 2
    if args.check_config:
        print(f"shiftd: {args.config or config_mod.DEFAULT_PATH}: OK")
        return 0
    log_writer = log_off_the_loop(
        (args.log_level or config.log_level).upper(),
        f"%(asctime)s shiftd[{config.host}] %(levelname)s %(name)s: %(message)s",
        sys.stderr,
    )
    try:
        failure = run(config)
    finally:
        log_writer.stop()  # what is queued is written, before the failure's line
    if failure is not None:
        print(f"shiftd: {failure}", file=sys.stderr)
        return 1
    return 0


def run(config: config_mod.Config) -> StartupError | None:
    """Serve until a signal ends it; what kept the daemon from starting, if anything did."""
    try:
        asyncio.run(serve(config))
    except StartupError as exc:
        return exc
    except KeyboardInterrupt:
        pass
    return None


if __name__ == "__main__":
    sys.exit(main())
