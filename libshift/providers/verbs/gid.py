"""Which GID a port's QPs use: the GID table from sysfs, and the choice of index by type and address.

A RoCE port has one GID per (address, RoCE version) of its netdev and VLANs, and the indices move when
addresses come and go or the link flaps; so the index is chosen by what the entry is, never fixed, and
chosen again on GID_CHANGE and PORT_ACTIVE. Layout (ib_core): class/infiniband/DEV/ports/N/gids/I,
gid_attrs/types/I ("RoCE v2", "IB/RoCE v1") and gid_attrs/ndevs/I; unused entries read as zeros (gids)
or fail with EINVAL (attrs).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from libshift.gid import canonical_gid
from libshift.vocabulary.errors import VerbsError

ROCE_V2 = "RoCE v2"
ETHERNET = "Ethernet"


@dataclass(frozen=True)
class GidEntry:
    index: int
    gid: str  # canonical text: IPv4-mapped as ::ffff:a.b.c.d, others compressed
    type: str  # "RoCE v2", "IB/RoCE v1" (RoCE v1 on Ethernet, the port GID on InfiniBand)
    netdev: str  # "" on InfiniBand

    @property
    def address(self) -> ipaddress.IPv6Address:
        return ipaddress.IPv6Address(self.gid)


def exploded_gid(gid: str) -> str:
    """The eight-group form pyverbs' GID() parses."""
    return ipaddress.IPv6Address(gid).exploded


def port_dir(sysfs_root: Path, device: str, port: int) -> Path:
    return sysfs_root / "class" / "infiniband" / device / "ports" / str(port)


def read_gid_table(sysfs_root: Path, device: str, port: int) -> list[GidEntry]:
    """The port's valid GID entries, by index."""
    base = port_dir(sysfs_root, device, port)
    entries = []
    indices = sorted(int(p.name) for p in (base / "gids").glob("*") if p.name.isdigit())
    for index in indices:
        raw = read_attr(base / "gids" / str(index))
        try:
            address = ipaddress.IPv6Address(raw)
        except ValueError:
            continue
        if address == ipaddress.IPv6Address(0):
            continue  # unused entry
        gid_type = read_attr(base / "gid_attrs" / "types" / str(index))
        if not gid_type:
            continue  # vanished between the two reads
        netdev = read_attr(base / "gid_attrs" / "ndevs" / str(index))
        entries.append(GidEntry(index, canonical_gid(raw), gid_type, netdev))
    return entries


def port_netdev(sysfs_root: Path, device: str, port: int) -> str:
    """The RoCE port's own netdev: that of its lowest valid GID entry (the default GID, which ib_core gives
    the port's netdev, a bond's under RoCE LAG); "" when no entry is valid. It reads up to that entry, not
    the whole table: rxe's has 1024 entries, and a full read for every device on every device listing
    made opening a ShiftContext on rxe take 36 s under TCG."""
    ndevs = port_dir(sysfs_root, device, port) / "gid_attrs" / "ndevs"
    for index in sorted(int(p.name) for p in ndevs.glob("*") if p.name.isdigit()):
        if name := read_attr(ndevs / str(index)):
            return name
    return ""


def choose_gid(entries: list[GidEntry], link_layer: str, netdev: str = "") -> GidEntry:
    """The entry a QP on this port should use.

    InfiniBand: the port GID (the lowest index). RoCE: RoCE v2 before v1 (v2 is routable, the default of
    every fabric SHIFT targets); an entry of the port's own netdev before a VLAN's; an IPv4 address before
    a global IPv6 one before a link-local one (rails are IPv4 subnets; a link-local GID does not cross a
    router); then the lowest index.
    """
    if not entries:
        raise VerbsError("the port has no valid GID (on RoCE: its netdev has no address and is down?)")
    if link_layer != ETHERNET:
        return min(entries, key=lambda entry: entry.index)

    def rank(entry: GidEntry) -> tuple[bool, bool, int, int]:
        address = entry.address
        kind = 0 if address.ipv4_mapped is not None else 2 if address.is_link_local else 1
        own = not netdev or entry.netdev == netdev
        return entry.type != ROCE_V2, not own, kind, entry.index

    return min(entries, key=rank)


def read_attr(path: Path) -> str:
    """A sysfs attribute's text; "" when absent or unreadable."""
    try:
        return path.read_text().strip()
    except OSError:  # unused entries answer EINVAL
        return ""
