"""shiftd's Prometheus metrics: names prefixed shift_, base units, node_exporter's conventions.

No label carries a QP or an agent id: cardinality stays bounded by the number of NICs.
"""

from __future__ import annotations

import platform
import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    start_http_server,
)

from shiftd import __version__
from shiftd.nic import NicState

# node_exporter exposes no *_created series; neither do we (a process-wide prometheus_client switch).
disable_created_metrics()

DOWNTIME_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.nic_up = Gauge(
            "shift_nic_up", "Whether the NIC is usable (1) or not (0).", ["device", "netdev"], registry=r
        )
        self.nic_state = Gauge(
            "shift_nic_state",
            "Health state of the NIC: 1 for the current state.",
            ["device", "netdev", "state"],
            registry=r,
        )
        self.link_events = Counter(
            "shift_link_events_total",
            "Link state changes seen on the NIC's netdev.",
            ["device", "netdev"],
            registry=r,
        )
        self.flap_penalty = Gauge(
            "shift_nic_flap_penalty",
            "Flap damping's penalty of the NIC: each flap adds to it, it halves every half-life; above the "
            "suppress threshold the NIC is held DOWN until it has decayed to the reuse threshold.",
            ["device", "netdev"],
            registry=r,
        )
        self.retransmits = Gauge(
            "shift_nic_retransmit_ratio",
            "Share of the data segments the NIC's TCP connections sent over the loss judge's last window "
            "that were retransmissions; NaN while they sent too few to judge.",
            ["device", "netdev"],
            registry=r,
        )
        self.speed = Gauge(
            "shift_nic_speed_ratio",
            "The rate of the NIC's TCP traffic the network held back, over the speed judge's last window, as "
            "a share of the NIC's best rate; NaN while too little was held back to judge.",
            ["device", "netdev"],
            registry=r,
        )
        self.nic_transitions = Counter(
            "shift_nic_transitions_total",
            "Health state changes of the NIC.",
            ["device", "state", "reason"],
            registry=r,
        )
        self.faults = Counter(
            "shift_fault_injections_total", "Faults injected by operators.", ["device", "mode"], registry=r
        )
        self.agents = Gauge("shift_agents", "libshift agents registered with this daemon.", registry=r)
        self.mappings = Gauge(
            "shift_published_mappings", "Backup mappings published by agents.", ["kind"], registry=r
        )
        self.etcd_errors = Counter("shift_etcd_errors_total", "Failed etcd operations.", ["kind"], registry=r)
        self.etcd_up = Gauge("shift_etcd_up", "Whether etcd is reachable with a live lease.", registry=r)
        self.etcd_pending = Gauge("shift_etcd_pending_writes", "Writes queued for etcd.", registry=r)
        self.failovers = Counter(
            "shift_failovers_total", "Failovers reported by agents.", ["device", "reason"], registry=r
        )
        self.failbacks = Counter(
            "shift_failbacks_total", "Failbacks reported by agents.", ["device"], registry=r
        )
        self.reports_dropped = Counter(
            "shift_agent_reports_dropped_total",
            "Failover and failback reports agents dropped, never delivered (their queue was full while "
            "shiftd was away).",
            registry=r,
        )
        self.downtime = Histogram(
            "shift_failover_downtime_seconds",
            "Time from failure detection to traffic on the backup.",
            buckets=DOWNTIME_BUCKETS,
            registry=r,
        )
        self.backup_qps = Gauge(
            "shift_backup_qps",
            "QPs whose default NIC is this device and which run on a backup NIC now.",
            ["device"],
            registry=r,
        )
        self.rewound = Counter(
            "shift_rewound_work_requests_total", "Work requests re-posted on a backup QP.", registry=r
        )
        self.grpc_requests = Counter(
            "shift_grpc_requests_total", "gRPC calls handled.", ["method", "code"], registry=r
        )
        self.build_info = Gauge(
            "shift_build_info", "Build information; always 1.", ["version", "python_version"], registry=r
        )
        self.build_info.labels(__version__, platform.python_version()).set(1)
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def set_nic(self, device: str, netdev: str, state: NicState) -> None:
        self.nic_up.labels(device, netdev).set(1 if state == NicState.UP else 0)
        for candidate in (NicState.UP, NicState.DOWN, NicState.DEGRADED):
            self.nic_state.labels(device, netdev, candidate.name.lower()).set(1 if candidate == state else 0)

    def serve(self, host: str, port: int) -> None:
        """Expose /metrics on HOST:PORT from a thread of prometheus_client's own."""
        self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)

    @property
    def address(self) -> str:
        if self._server is None:
            return ""
        host, port = self._server.server_address[:2]
        return f"{host}:{port}"

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
