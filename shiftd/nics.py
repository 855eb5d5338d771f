"""The NICs of this host: one health state machine each, fed by the monitors.

The table maps netdev signals to devices, asks `NicHealth` what they mean, and hands every
resulting transition to one callback (the daemon turns it into an event, an etcd write and
metrics). It also renders the `Nic` records that the API returns.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from libshift.api.shift.v1 import common_pb2
from libshift.gid import gid_of_ipv4
from shiftd.config import DampingConfig, LossConfig, SlowConfig
from shiftd.health import NicHealth, Transition
from shiftd.nic import (
    DeviceChange,
    FaultMode,
    LinkStatus,
    NicSpec,
    NicState,
    PortStatus,
    Traffic,
    combined,
    gid_replaced,
)


def nic_name(device: str, port: int) -> str:
    """How operators name a NIC: the device for port 1 (nearly every RNIC), DEVICE/PORT otherwise."""
    return device if port == 1 else f"{device}/{port}"


class UnknownDevice(KeyError):
    """A device name that this host does not have."""


@dataclass
class NicRecord:
    name: str  # see nic_name
    spec: NicSpec
    health: NicHealth
    wall_last_change_ns: int = 0
    link_events_exported: int = 0  # how many of health.link_events shift_link_events_total counts
    gid: str = ""  # its GID, or the last it had while it has no address (between one address and the next)


NO_TRAFFIC = Traffic(0, 0, 0, 0)


class NicTable:
    def __init__(
        self,
        specs: list[NicSpec],
        hold_down: float,
        on_transition: Callable[[NicRecord, Transition], None],
        on_input: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
        on_readdressed: Callable[[NicRecord, tuple[str, ...], str], None] = lambda record, before, gid: None,
        damping: DampingConfig | None = None,
        loss: LossConfig | None = None,
        slow: SlowConfig | None = None,
    ) -> None:
        self._clock = clock
        self._on_transition = on_transition
        self._on_input = on_input  # any input may move a hold-down deadline
        # its addresses changed: (record, the addresses before, the GID a new one replaced or "")
        self._on_readdressed = on_readdressed
        self.records: dict[str, NicRecord] = {
            nic_name(spec.device, spec.port): NicRecord(
                nic_name(spec.device, spec.port),
                spec,
                NicHealth(spec, hold_down, damping, loss, slow),
                time.time_ns(),
            )
            for spec in specs
        }

    @property
    def devices(self) -> list[str]:
        return sorted(self.records)

    def get(self, device: str) -> NicRecord:
        try:
            return self.records[device]
        except KeyError:
            raise UnknownDevice(device) from None

    def netdevs(self) -> set[str]:
        return {r.spec.netdev for r in self.records.values()}

    def link_changed(self, status: LinkStatus) -> None:
        for record in self.records.values():
            if record.spec.netdev == status.netdev:
                before = record.health.link
                self._input(record, record.health.update_link(status, self._clock()))
                gid = gid_of_addresses(status.addresses)
                replaced, record.gid = gid_replaced(record.gid, gid), gid or record.gid
                if before is not None and status.present and before.addresses != status.addresses:
                    self._on_readdressed(record, before.addresses, replaced)

    def port_changed(self, status: PortStatus) -> None:
        record = self.records.get(nic_name(status.device, status.port))
        if record is not None:
            self._input(record, record.health.update_port(status, self._clock()))

    def device_changed(self, change: DeviceChange) -> None:
        for record in self.records.values():
            name = record.spec.netdev if change.subsystem == "net" else record.spec.device
            if name == change.name:
                present = change.action == "add"
                self._input(record, record.health.set_present(present, self._clock()))

    def traffic_sent(self, by_source: dict[str, Traffic]) -> None:
        """What the TCP sockets of each source address did since the last poll (tcp_loss): every NIC with an
        address hears its share, nothing included, so that its judges see time pass."""
        now = self._clock()
        for record in self.records.values():
            addresses = record.health.link.addresses if record.health.link else ()
            if not addresses:
                continue
            total = combined(by_source.get(address, NO_TRAFFIC) for address in addresses)
            health = record.health
            lost = health.update_traffic(total.segments, total.retransmitted, now, total.by_peer)
            self._apply(record, lost)
            self._apply(
                record, health.update_throughput(total.acked, total.limited, total.busy, now, total.by_peer)
            )

    def port_sent(self, device: str, port: int, packets: int, retransmitted: int) -> None:
        """An RDMA port's packets sent, and retransmissions, since the last poll (rdma_sysfs)."""
        record = self.records.get(nic_name(device, port))
        if record is not None:
            self._apply(record, record.health.update_traffic(packets, retransmitted, self._clock()))

    def move_off(self, device: str) -> bool:
        """Whether the agents should move their traffic off `device`: its own traffic is being lost or runs
        far below its best (DEGRADED, retransmits or slow) and another NIC of the host is UP and shows
        neither."""
        if not self.get(device).health.judged_bad:
            return False
        return any(
            record.health.state is NicState.UP and not record.health.judged_bad
            for name, record in self.records.items()
            if name != device
        )

    def set_fault(self, device: str, mode: FaultMode) -> None:
        record = self.get(device)
        self._input(record, record.health.set_fault(mode, self._clock()))

    def tick(self) -> None:
        now = self._clock()
        for record in self.records.values():
            self._apply(record, record.health.tick(now))

    def next_deadline(self) -> float | None:
        deadlines = [d for r in self.records.values() if (d := r.health.next_deadline()) is not None]
        return min(deadlines, default=None)

    def _input(self, record: NicRecord, transition: Transition | None) -> None:
        """An outside signal arrived: apply it and let the timer recompute its deadline."""
        self._apply(record, transition)
        self._on_input()

    def _apply(self, record: NicRecord, transition: Transition | None) -> None:
        if transition is None:
            return
        record.wall_last_change_ns = time.time_ns()
        self._on_transition(record, transition)

    def to_proto(self, device: str) -> common_pb2.Nic:
        record = self.get(device)
        health = record.health
        link = health.link
        port = health.port
        return common_pb2.Nic(
            device=device,
            netdev=record.spec.netdev,
            provider=record.spec.provider,
            state=int(health.state),
            reason=health.reason,
            admin_up=bool(link and link.admin_up),
            operstate=link.operstate if link else "absent",
            carrier=bool(link and link.carrier),
            port_state=port.state if port else "",
            fault=int(health.fault),
            addresses=list(link.addresses) if link else [],
            last_change_unix_nanos=record.wall_last_change_ns,
            link_events=health.link_events,
            gid=gid_of_addresses(link.addresses) if link else "",
            flap_penalty=self.flap_penalty(device),
        )

    def flap_penalty(self, device: str) -> float:
        """The NIC's damping penalty now (also read by /metrics, from its own thread: two floats)."""
        return self.get(device).health.damper.penalty(self._clock())

    def all_protos(self) -> list[common_pb2.Nic]:
        return [self.to_proto(device) for device in self.devices]


def gid_of_addresses(addresses: tuple[str, ...]) -> str:
    """A netdev's RoCE GID: its first IPv4 address, IPv4-mapped ("" without one)."""
    ipv4 = [a for a in addresses if ":" not in a]
    return gid_of_ipv4(ipv4[0].split("/")[0]) if ipv4 else ""
