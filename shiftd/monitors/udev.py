"""Device add/remove from udev -> DeviceChange, for the net and infiniband subsystems.

A NIC that is hot-removed (or whose driver is unbound) disappears as a device before any link
state says so. With a udev daemon the events come after udev's rules, with final names. Hosts
and containers without one (no /run/udev/control) still get the kernel's own uevents, which
carry kernel names (before any udev rename); network devices' uevents reach the network
namespace that holds the device, so this works inside the lab's namespaces too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pyudev

from shiftd.monitors import register
from shiftd.nic import DeviceChange

if TYPE_CHECKING:
    from shiftd.config import MonitorsConfig
    from shiftd.nics import NicTable

log = logging.getLogger(__name__)

UDEV_CONTROL = Path("/run/udev/control")  # the udev daemon's control socket: present while it runs
SUBSYSTEMS = ("net", "infiniband")
ACTIONS = ("add", "remove")


class UdevMonitor:
    """Reports add/remove of net and infiniband devices through `on_change`.

    `description` says what it watches, for `shiftctl status` and the log: "udev",
    "kernel uevents (no udev daemon)", or "off: <why>".
    """

    def __init__(self, on_change: Callable[[DeviceChange], None], udev_control: Path = UDEV_CONTROL) -> None:
        self.on_change = on_change
        if udev_control.exists():
            self.source, self.description = "udev", "udev"
        else:
            self.source, self.description = "kernel", "kernel uevents (no udev daemon)"
            log.info("no udev daemon (%s is missing): watching kernel uevents instead", udev_control)

    async def run(self) -> None:
        """Report device changes until cancelled; returns at once if no monitor can be opened."""
        try:
            monitor = pyudev.Monitor.from_netlink(pyudev.Context(), source=self.source)
            for subsystem in SUBSYSTEMS:
                monitor.filter_by(subsystem)
            monitor.start()
        except (OSError, ImportError) as exc:  # no permission, no netlink, no libudev
            self.description = f"off: cannot open a {self.source} monitor: {exc}"
            log.warning("device add/remove is not watched: %s", self.description)
            return
        loop = asyncio.get_running_loop()
        loop.add_reader(monitor.fileno(), self._drain, monitor)
        try:
            await loop.create_future()  # forever: the reader does the work
        finally:
            loop.remove_reader(monitor.fileno())
            # pyudev has no close(): the socket goes with the last reference, and a cancelled
            # task's traceback would keep this frame (and so the monitor) alive
            del monitor

    def _drain(self, monitor: pyudev.Monitor) -> None:
        while (device := monitor.poll(timeout=0)) is not None:
            if device.action in ACTIONS and device.subsystem in SUBSYSTEMS:
                change = DeviceChange(device.action, device.subsystem, device.sys_name)
                log.debug("device %s", change)
                self.on_change(change)


@register("udev")
def _from_config(config: MonitorsConfig, nics: NicTable) -> UdevMonitor | None:
    return UdevMonitor(nics.device_changed) if config.udev else None
