"""RDMA port state from sysfs -> PortStatus, on change.

ib_core sends no netlink or uevent when a port's logical state moves (DOWN, INIT, ARMED,
ACTIVE), so the one way to see it is to read sysfs; a short poll of a few small files is cheap.
A port whose files vanish (device removed) reads as state DOWN with an empty phys_state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from pathlib import Path

from shiftd.inventory import port_status
from shiftd.nic import PortStatus


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
            if self._last.get((device, port)) != status:
                self._last[(device, port)] = status
                changed.append(status)
                self.on_port(status)
        return changed

    async def run(self) -> None:
        """Report every port at once, then each change, until cancelled."""
        while True:
            self.poll()
            await asyncio.sleep(self.interval)
