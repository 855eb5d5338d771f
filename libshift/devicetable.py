"""The tcp devices' table, device name -> netdev: one grammar for shiftd's config and the tcp provider.

Two spellings. The `[devices]` table of the config file (`mlx5_0 = "ens1f0np0"`), which shiftd watches and
the tcp provider opens: one device per netdev, as on real hardware. And SHIFT_TCP_DEVICES
(`mlx5_0=ens1f0np0,mlx5_1=ens2f0np0@h1`), the provider's override for tests and benches: `@netns` puts a
device's sockets in that network namespace (a lab host), and devices may share a netdev (two on `lo` fail
over within one host). Standard library only and no other libshift import: shiftd imports this module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ENV_DEVICES = "SHIFT_TCP_DEVICES"
NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # a device (mlx5_0) or a network namespace
NETDEV_RE = re.compile(r"[A-Za-z0-9_.-]{1,15}")  # Linux: at most 15 bytes, never '/', ':' or a space
NAME_RULE = "1-64 letters, digits, '_', '.' or '-'"


class DeviceTableError(ValueError):
    """A bad table or entry; str() is one line that starts with where it is (`devices.mlx5_0: ...`)."""


@dataclass(frozen=True)
class DeviceEntry:
    name: str
    netdev: str
    netns: str | None = None  # None: the reader's own namespace


def parse_table(table: object) -> list[DeviceEntry]:
    """The config file's `[devices]` table (parsed TOML), in its order."""
    if not isinstance(table, dict):
        raise DeviceTableError('devices: must be a table of device = "netdev"')
    entries: list[DeviceEntry] = []
    for name, netdev in table.items():
        where = f"devices.{name}"
        _check_name(where, name)
        if not isinstance(netdev, str) or not NETDEV_RE.fullmatch(netdev):
            hint = (
                f" (@netns belongs in {ENV_DEVICES} only)"
                if isinstance(netdev, str) and "@" in netdev
                else ""
            )
            raise DeviceTableError(f"{where}: {netdev!r} is not a valid network interface name{hint}")
        if any(entry.netdev == netdev for entry in entries):
            raise DeviceTableError(f"{where}: netdev {netdev!r} is already used by another device")
        entries.append(DeviceEntry(name, netdev))
    return entries


def parse_list(text: str) -> list[DeviceEntry]:
    """A SHIFT_TCP_DEVICES value: comma-separated `name=netdev[@netns]`, spaces around them ignored."""
    entries: list[DeviceEntry] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        where = f"{ENV_DEVICES} entry {item!r}"
        name, sep, value = item.partition("=")
        name, (netdev, at, netns) = name.strip(), value.strip().partition("@")
        if not sep or not name or not netdev:
            raise DeviceTableError(f"{where}: expected name=netdev[@netns]")
        _check_name(where, name)
        if not NETDEV_RE.fullmatch(netdev):
            raise DeviceTableError(f"{where}: {netdev!r} is not a valid network interface name")
        if at and not NAME_RE.fullmatch(netns):
            raise DeviceTableError(f"{where}: {netns!r} is not a valid network namespace name ({NAME_RULE})")
        if any(entry.name == name for entry in entries):
            raise DeviceTableError(f"{where}: device {name!r} is named twice")
        entries.append(DeviceEntry(name, netdev, netns or None))
    return entries


def _check_name(where: str, name: str) -> None:
    if not NAME_RE.fullmatch(name):
        raise DeviceTableError(f"{where}: not a valid device name ({NAME_RULE})")
