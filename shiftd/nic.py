"""The NIC model shared by the inventory, the monitors and the health tracker.

Monitors turn kernel signals into these plain values; the health tracker turns them into a
NicState. Values mirror shift.v1.NicState and shift.v1.FaultMode so conversion is int().
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple


class NicState(enum.IntEnum):
    UNSPECIFIED = 0
    UP = 1
    DOWN = 2
    DEGRADED = 3


class FaultMode(enum.IntEnum):
    NONE = 0
    DOWN = 1
    BLACKHOLE = 2
    FLAP = 3
    LOSSY = 4
    SLOW = 5


@dataclass(frozen=True)
class NicSpec:
    """One NIC that shiftd watches: an RDMA device, its netdev and port, and its provider."""

    device: str
    netdev: str
    provider: str  # "tcp" (declared in the config) or "verbs" (found in sysfs)
    port: int = 1


@dataclass(frozen=True)
class LinkStatus:
    """A netdev's link as netlink reports it (RTM_NEWLINK / RTM_DELLINK)."""

    netdev: str
    present: bool
    admin_up: bool = False
    operstate: str = "unknown"  # lower case, as in /sys/class/net/*/operstate
    carrier: bool = False  # IFF_LOWER_UP: never while the link is down
    addresses: tuple[str, ...] = ()

    @property
    def usable(self) -> bool:
        return self.present and self.admin_up and self.carrier and self.operstate in ("up", "unknown")


@dataclass(frozen=True)
class PortStatus:
    """An RDMA port's state from /sys/class/infiniband/DEV/ports/N/{state,phys_state}."""

    device: str
    port: int
    state: str  # DOWN, INIT, ARMED, ACTIVE, ACTIVE_DEFER
    phys_state: str  # e.g. LinkUp, Disabled, Polling
    link_downed: int = 0  # counters/link_downed when readable


@dataclass(frozen=True)
class DeviceChange:
    """A udev add/remove of a network or infiniband device."""

    action: str  # "add" or "remove"
    subsystem: str  # "net" or "infiniband"
    name: str  # netdev or RDMA device name


class Traffic(NamedTuple):
    """What a NIC's TCP sockets (or one source address's) did between two polls of the tcp_loss monitor."""

    segments: int  # data segments sent, retransmissions included
    retransmitted: int
    acked: int  # bytes the peers acknowledged
    limited: int  # of those, the bytes of sockets the network held back (not application-limited)
    busy: float = 0.0  # seconds the longest busy of those sockets had data in flight (0: not known)
    by_peer: tuple[PeerTraffic, ...] = ()  # the same by peer address, in its order


class PeerTraffic(NamedTuple):
    """One peer's share of a poll's Traffic: what the sockets connected to it did."""

    peer: str
    segments: int
    retransmitted: int
    limited: int = 0  # bytes the network held back
    busy: float = 0.0  # seconds the longest busy of those sockets had them in flight


def by_peer(shares: Iterable[PeerTraffic]) -> tuple[PeerTraffic, ...]:
    """Each peer's shares added into one (the busy time the longest: at once, not in turn), by peer."""
    peers: dict[str, PeerTraffic] = {}
    for share in shares:
        seen = peers.get(share.peer)
        peers[share.peer] = (
            share
            if seen is None
            else PeerTraffic(
                share.peer,
                seen.segments + share.segments,
                seen.retransmitted + share.retransmitted,
                seen.limited + share.limited,
                max(seen.busy, share.busy),
            )
        )
    return tuple(peers[peer] for peer in sorted(peers))


def combined(shares: Iterable[Traffic]) -> Traffic:
    """The traffic of several source addresses (one NIC's): counts added, the busy time the longest (the
    sockets ran at once, not in turn), each peer's shares added across them."""
    shares = list(shares)
    return Traffic(
        sum(share.segments for share in shares),
        sum(share.retransmitted for share in shares),
        sum(share.acked for share in shares),
        sum(share.limited for share in shares),
        max((share.busy for share in shares), default=0.0),
        by_peer(peer for share in shares for peer in share.by_peer),
    )


def gid_replaced(last: str, gid: str) -> str:
    """The GID that a NIC's `gid` now replaces, the `last` one it had known ("" when it replaces none: it
    has no GID at the moment, the same one, or had none before)."""
    return last if gid and last and gid != last else ""
