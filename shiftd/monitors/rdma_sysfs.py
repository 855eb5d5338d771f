"""RDMA port state from sysfs -> PortStatus, on change.

ib_core sends no netlink or uevent when a port's logical state moves (DOWN, INIT, ARMED,
ACTIVE), so the one way to see it is to read sysfs; a short poll of a few small files is cheap.
A port whose files vanish (device removed) reads as state DOWN with an empty phys_state.

A link that goes down and comes back between two polls leaves only one trace: counters/link_downed
went up. The monitor reports such a flap as it happened, a DOWN (phys_state MISSED_FLAP) and then the
state read now, so the health tracker's flap damping holds the NIC as it would for a flap it saw.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from shiftd.inventory import port_status
from shiftd.monitors import register
from shiftd.nic import PortStatus

if TYPE_CHECKING:
    from shiftd.config import MonitorsConfig
    from shiftd.nics import NicTable

MISSED_FLAP = "LinkDown (between polls)"
DOWN_STATES = ("DOWN", "NOP")


class RdmaSysfsMonitor:
    """Polls the given (device, port) pairs every `interval` seconds and reports changes."""

    def __init__(
        self,
        sysfs_root: str | Path,
        ports: Iterable[tuple[str, int]],
        interval: float,
        on_port: Callable[[PortStatus], None],
    ) -> None:
        self.sysfs_root = Path(sysfs_root)
        self.ports = tuple(ports)
        self.interval = interval
        self.on_port = on_port
        self._last: dict[tuple[str, int], PortStatus] = {}

    def poll(self) -> list[PortStatus]:
        """Read every port once; report (and return) those that differ from the last read."""
        changed = []
        for device, port in self.ports:
            status = port_status(self.sysfs_root, device, port) or PortStatus(device, port, "DOWN", "")
            last = self._last.get((device, port))
            if last is not None and missed_flap(last, status):
                changed.append(PortStatus(device, port, "DOWN", MISSED_FLAP, status.link_downed))
            if last != status:
                changed.append(status)
            self._last[(device, port)] = status
        for status in changed:
            self.on_port(status)
        return changed

    async def run(self) -> None:
        """Report every port at once, then each change, until cancelled."""
        while True:
            self.poll()
            await asyncio.sleep(self.interval)


def missed_flap(last: PortStatus, now: PortStatus) -> bool:
    """The port was up at both reads, yet its link went down in between (link_downed counted it)."""
    return (
        now.link_downed > last.link_downed and last.state not in DOWN_STATES and now.state not in DOWN_STATES
    )


@register("rdma_sysfs")
def _from_config(config: MonitorsConfig, nics: NicTable) -> RdmaSysfsMonitor | None:
    """Polls the ports of the verbs devices; off when there are none (tcp devices only)."""
    ports = [(r.spec.device, r.spec.port) for r in nics.records.values() if r.spec.provider == "verbs"]
    if not (config.rdma_sysfs and ports):
        return None
    return RdmaSysfsMonitor(config.sysfs_root, ports, config.rdma_poll_seconds, nics.port_changed)
