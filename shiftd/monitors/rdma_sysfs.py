"""RDMA port state from sysfs -> PortStatus, on change.

ib_core sends no netlink or uevent when a port's logical state moves (DOWN, INIT, ARMED,
ACTIVE), so the one way to see it is to read sysfs; a short poll of a few small files is cheap.
A port whose files vanish (device removed) reads as state DOWN with an empty phys_state.

A link that goes down and comes back between two polls leaves only one trace: counters/link_downed
went up. The monitor reports such a flap as it happened, a DOWN (phys_state MISSED_FLAP) and then the
state read now, so the health tracker's flap damping holds the NIC as it would for a flap it saw.

Where rdma-core can open the devices, their async events (PORT_ERR, PORT_ACTIVE, shiftd.async_events)
cut the wait: an event makes the monitor read the ports at once rather than at the next poll.

Each poll also reads what each port sent and resent since the last (inventory.port_sent: the driver's
hw_counters) and hands it to `on_sent`, the loss judge's evidence on an RNIC, whose traffic is not TCP.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from shiftd.async_events import AsyncPortEvents
from shiftd.inventory import port_sent, port_status
from shiftd.monitors import register
from shiftd.nic import PortStatus

if TYPE_CHECKING:
    from shiftd.config import MonitorsConfig
    from shiftd.nics import NicTable

MISSED_FLAP = "LinkDown (between polls)"
DOWN_STATES = ("DOWN", "NOP")


class RdmaSysfsMonitor:
    """Polls the given (device, port) pairs every `interval` seconds, and at once on a device's async
    event when `async_events` is set, and reports changes."""

    def __init__(
        self,
        sysfs_root: str | Path,
        ports: Iterable[tuple[str, int]],
        interval: float,
        on_port: Callable[[PortStatus], None],
        async_events: bool = False,
        on_sent: Callable[[str, int, int, int], None] | None = None,
    ) -> None:
        self.sysfs_root = Path(sysfs_root)
        self.ports = tuple(ports)
        self.interval = interval
        self.on_port = on_port
        self.async_events = async_events
        self.on_sent = on_sent  # (device, port, packets, retransmissions) since the last poll
        self.events: AsyncPortEvents | None = None  # while run() runs with async_events
        self._last: dict[tuple[str, int], PortStatus] = {}
        self._last_sent: dict[tuple[str, int], tuple[int, int]] = {}

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
        if self.on_sent is not None:
            self._count_sent(self.on_sent)
        return changed

    def _count_sent(self, on_sent: Callable[[str, int, int, int], None]) -> None:
        """What each port sent and resent since the last poll; the first read of a port is only its
        baseline, and a counter that went back (the driver reloaded) starts a new one."""
        for device, port in self.ports:
            now = port_sent(self.sysfs_root, device, port)
            last = self._last_sent.pop((device, port), None)
            if now is None:
                continue
            self._last_sent[(device, port)] = now
            if last is not None and now[0] >= last[0] and now[1] >= last[1]:
                on_sent(device, port, now[0] - last[0], now[1] - last[1])

    async def run(self) -> None:
        """Report every port at once, then each change, until cancelled."""
        loop, woken = asyncio.get_running_loop(), asyncio.Event()
        try:
            self.poll()  # first: shiftd answers once every port has a state, and opening devices takes time
            if self.async_events:
                self.events = await self._open_events(lambda _: loop.call_soon_threadsafe(woken.set))
            while True:
                woken.clear()  # before the read: an event that comes during it brings another
                self.poll()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), self.interval)
        finally:
            if self.events is not None:
                self.events.close()
                self.events = None

    async def _open_events(self, on_event: Callable[[str], None]) -> AsyncPortEvents:
        """The devices' event readers, opened off the loop (seconds under emulation); closed when the
        monitor is cancelled meanwhile, once the opening ends."""
        devices = {device for device, _ in self.ports}
        opening = asyncio.get_running_loop().run_in_executor(None, AsyncPortEvents, devices, on_event)
        try:
            return await asyncio.shield(opening)
        except asyncio.CancelledError:
            opening.add_done_callback(
                lambda done: done.cancelled() or done.exception() or done.result().close()
            )
            raise


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
    return RdmaSysfsMonitor(
        config.sysfs_root,
        ports,
        config.rdma_poll_seconds,
        nics.port_changed,
        config.rdma_async_events,
        on_sent=nics.port_sent,
    )
