"""Monitors: each turns one kind of kernel signal into the plain values of shiftd.nic.

netlink (LinkStatus), udev (DeviceChange) and rdma_sysfs (PortStatus). Each runs as an asyncio
task (`await monitor.run()`), reports through a plain callback, and closes what it opened
when cancelled.

Each module of this package registers itself by name (`@register("netlink")`) with a factory that
builds its monitor from the config and the NIC table, or returns None when the config leaves it off.
The daemon builds whatever the registry holds, so a monitor is added by adding its module here.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from shiftd.config import MonitorsConfig
    from shiftd.nics import NicTable


class Monitor(Protocol):
    async def run(self) -> None: ...


Factory = Callable[["MonitorsConfig", "NicTable"], "Monitor | None"]


class UnknownMonitor(ValueError):
    """A monitor name that no module of shiftd.monitors registered."""


_registry: dict[str, Factory] = {}


def register(name: str) -> Callable[[Factory], Factory]:
    """Register `factory` as the monitor called `name` (each name once)."""

    def add(factory: Factory) -> Factory:
        if name in _registry:
            raise ValueError(f"monitor {name!r} is registered twice")
        _registry[name] = factory
        return factory

    return add


def names() -> list[str]:
    return sorted(_registry)


def factory(name: str) -> Factory:
    try:
        return _registry[name]
    except KeyError:
        raise UnknownMonitor(f"no monitor named {name!r} (known: {', '.join(names())})") from None


def build(config: MonitorsConfig, nics: NicTable) -> dict[str, Monitor]:
    """Every registered monitor that the config turns on, by name."""
    built = {name: factory(name)(config, nics) for name in names()}
    return {name: monitor for name, monitor in built.items() if monitor is not None}


# Import every module of the package: each registers its monitor as it is imported.
for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
