"""Link state from rtnetlink -> LinkStatus, event-driven.

The kernel multicasts RTM_NEWLINK/RTM_DELLINK/RTM_NEWADDR/RTM_DELADDR the moment a link or an
address changes; reacting to those (never polling) is what makes a cable pull reach libshift
fast. Two sockets:

- the event socket joins the link and IPv4 address groups *before* anything is dumped, so a
  change during the dump is queued on it rather than lost; it is read by the event loop
  (add_reader) and decoded by the few lines in this module, because pyroute2's full decoding
  of one RTM_NEWLINK costs ~0.4 ms of Python, which alone would spend the daemon's latency
  budget (link down -> gRPC subscriber well under 1 ms). The carrier is read from the
  header's flags (IFF_LOWER_UP), not from IFLA_CARRIER, the 22nd attribute: the two
  attributes still read (IFLA_IFNAME, IFLA_OPERSTATE) come first, and every attribute walked
  is Python woken from idle, several times slower than warm;
- the initial state comes from a pyroute2 AsyncIPRoute dump, where cost does not matter.

If the event socket overflows (ENOBUFS: the kernel has dropped events), both are opened again
and the dump is the truth; only what differs from the last report is reported.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
from collections.abc import Callable, Collection, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from pyroute2 import AsyncIPRoute
from pyroute2.netlink.rtnl import (
    RTM_DELADDR,
    RTM_DELLINK,
    RTM_NEWADDR,
    RTM_NEWLINK,
    RTMGRP_IPV4_IFADDR,
    RTMGRP_LINK,
)

from shiftd.monitors import register
from shiftd.nic import LinkStatus

if TYPE_CHECKING:
    from shiftd.config import MonitorsConfig
    from shiftd.nics import NicTable

log = logging.getLogger(__name__)

IFF_UP, IFF_LOWER_UP = 0x1, 0x10000
IFLA_IFNAME, IFLA_OPERSTATE = 3, 16
IFA_ADDRESS, IFA_LOCAL = 1, 2
LINK_ATTRS = frozenset((IFLA_IFNAME, IFLA_OPERSTATE))
ADDR_ATTRS = frozenset((IFA_ADDRESS, IFA_LOCAL))
OPERSTATES = ("unknown", "notpresent", "down", "lowerlayerdown", "testing", "dormant", "up")  # RFC 2863
NLMSG = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, seq, pid
IFINFO = struct.Struct("=BxHiII")  # ifinfomsg: family, type, index, flags, change
IFADDR = struct.Struct("=BBBBi")  # ifaddrmsg: family, prefixlen, flags, scope, index
RTA = struct.Struct("=HH")  # rtattr: length, type
RECV_BYTES = 1 << 18  # one datagram; a link with many SR-IOV VFs sends tens of KiB
RETRY_INITIAL_SECONDS = 0.05
RETRY_MAX_SECONDS = 5.0


class LinkMsg(NamedTuple):
    """What the monitor needs of an RTM_NEWLINK/RTM_DELLINK (AF_UNSPEC only). Named tuples, not
    dataclasses: built on the path of every NIC event, where a frozen dataclass costs ~30 us woken
    from idle on this VM.

    `carrier` is IFF_LOWER_UP, which `ip link` shows as LOWER_UP: the kernel sets it only while the
    link is up, as /sys/class/net/*/carrier answers only then (EINVAL while it is down)."""

    deleted: bool
    index: int
    name: str
    admin_up: bool = False
    operstate: str = "unknown"
    carrier: bool = False


class AddrMsg(NamedTuple):
    """What the monitor needs of an IPv4 RTM_NEWADDR/RTM_DELADDR."""

    deleted: bool
    index: int
    address: str


def decode(data: bytes | bytearray) -> Iterator[LinkMsg | AddrMsg]:
    """The link and IPv4 address messages in one netlink datagram; anything else is skipped.

    AF_BRIDGE link messages describe a bridge port's state, not the link, and carry no
    carrier: taking them for link messages would fake a carrier loss, so they are skipped.
    """
    offset = 0
    while offset + NLMSG.size <= len(data):
        length, kind, _, _, _ = NLMSG.unpack_from(data, offset)
        if length < NLMSG.size or offset + length > len(data):
            return  # malformed or truncated (a message larger than the read)
        body, end = offset + NLMSG.size, offset + length
        offset += (length + 3) & ~3
        if kind in (RTM_NEWLINK, RTM_DELLINK):
            family, _, index, flags, _ = IFINFO.unpack_from(data, body)
            if family != socket.AF_UNSPEC:
                continue
            attrs = attributes(data, body + IFINFO.size, end, LINK_ATTRS)
            operstate = attrs.get(IFLA_OPERSTATE, b"\0")[0]
            yield LinkMsg(
                deleted=kind == RTM_DELLINK,
                index=index,
                name=attrs.get(IFLA_IFNAME, b"").rstrip(b"\0").decode(),
                admin_up=bool(flags & IFF_UP),
                operstate=OPERSTATES[operstate] if operstate < len(OPERSTATES) else "unknown",
                carrier=bool(flags & IFF_LOWER_UP),
            )
        elif kind in (RTM_NEWADDR, RTM_DELADDR):
            family, _, _, _, index = IFADDR.unpack_from(data, body)
            if family != socket.AF_INET:
                continue
            attrs = attributes(data, body + IFADDR.size, end, ADDR_ATTRS)
            raw = attrs.get(IFA_LOCAL) or attrs.get(IFA_ADDRESS)
            if raw is not None:
                yield AddrMsg(kind == RTM_DELADDR, index, socket.inet_ntop(socket.AF_INET, raw))


def attributes(
    data: bytes | bytearray, offset: int, end: int, wanted: frozenset[int]
) -> dict[int, bytes | bytearray]:
    """The `wanted` attributes, read until all are found: a link message carries ~50 (stats,
    queues, nested specs), the kernel puts the two we need first and third, and every attribute
    skipped is Python time on the path to the agents."""
    attrs: dict[int, bytes | bytearray] = {}
    while offset + RTA.size <= end:
        length, kind = RTA.unpack_from(data, offset)
        if length < RTA.size or offset + length > end:
            break  # malformed: an attribute never reads past its message
        kind &= 0x3FFF  # without NLA_F_NESTED etc.
        if kind in wanted:
            attrs[kind] = data[offset + RTA.size : offset + length]
            if len(attrs) == len(wanted):
                break
        offset += (length + 3) & ~3
    return attrs


def _from_pyroute2(msg: Any) -> LinkMsg | AddrMsg:
    """The same record from a pyroute2 dump message (links are dumped with AF_UNSPEC)."""
    if msg["header"]["type"] == RTM_NEWLINK:
        return LinkMsg(
            deleted=False,
            index=msg["index"],
            name=msg.get("ifname"),
            admin_up=bool(msg["flags"] & IFF_UP),
            operstate=str(msg.get("IFLA_OPERSTATE", "unknown")).lower(),
            carrier=bool(msg["flags"] & IFF_LOWER_UP),
        )
    return AddrMsg(False, msg["index"], msg.get("IFA_LOCAL") or msg.get("IFA_ADDRESS"))


class NetlinkMonitor:
    """Reports the LinkStatus of the watched netdevs (all when `netdevs` is None), on change.

    Addresses are IPv4 addresses without prefix length, in the kernel's order (primary first).
    `on_link` runs on the event loop, straight from the socket's reader: keep it short.
    """

    def __init__(
        self,
        netdevs: Collection[str] | None,
        on_link: Callable[[LinkStatus], None],
        rcvbuf: int = 1 << 20,
    ) -> None:
        self.netdevs = None if netdevs is None else frozenset(netdevs)
        self.on_link = on_link
        self.rcvbuf = rcvbuf
        self._links: dict[int, LinkStatus] = {}  # ifindex -> link without addresses
        self._addresses: dict[int, list[str]] = {}  # ifindex -> IPv4 addresses
        self._reported: dict[str, LinkStatus] = {}
        self._backoff = RETRY_INITIAL_SECONDS

    async def run(self) -> None:
        """Dump, report every watched netdev, then report each change until cancelled."""
        while True:
            try:
                await self._session()
            except OSError as exc:
                log.warning(
                    "netlink monitor: %s; reopening the socket and dumping again",
                    os.strerror(exc.errno) if exc.errno else exc,
                )
            await asyncio.sleep(self._backoff)
            self._backoff = min(self._backoff * 2, RETRY_MAX_SECONDS)

    async def _session(self) -> None:
        loop = asyncio.get_running_loop()
        with socket.socket(
            socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_NONBLOCK, socket.NETLINK_ROUTE
        ) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.rcvbuf)
            sock.bind((0, RTMGRP_LINK | RTMGRP_IPV4_IFADDR))  # subscribe first, then dump
            await self._dump()
            self._backoff = RETRY_INITIAL_SECONDS
            failed: asyncio.Future[None] = loop.create_future()
            loop.add_reader(sock.fileno(), self._read, sock, bytearray(RECV_BYTES), failed)
            try:
                await failed
            finally:
                loop.remove_reader(sock.fileno())

    async def _dump(self) -> None:
        """Replace the tables with the kernel's view and report it (links missing from it as gone)."""
        self._links.clear()
        self._addresses.clear()
        async with AsyncIPRoute() as ipr:
            async for msg in await ipr.link("dump"):
                self._apply(_from_pyroute2(msg))
            async for msg in await ipr.addr("dump", family=socket.AF_INET):
                self._apply(_from_pyroute2(msg))
        dumped = {link.netdev for link in self._links.values()}
        for index in list(self._links):
            self._report_index(index)
        expected = self.netdevs if self.netdevs is not None else set(self._reported)
        for name in sorted(expected - dumped):
            self._report(LinkStatus(name, present=False))

    def _read(self, sock: socket.socket, buffer: bytearray, failed: asyncio.Future[None]) -> None:
        """Drain the event socket; a socket error ends the session (the caller resyncs)."""
        while True:
            try:
                data = buffer[: sock.recv_into(buffer)]
            except BlockingIOError:
                return
            except OSError as exc:
                if not failed.done():
                    failed.set_exception(exc)
                return
            for msg in decode(data):
                self._report_index(self._apply(msg))

    def _apply(self, msg: LinkMsg | AddrMsg) -> int:
        """Fold one message into the tables; returns the ifindex it concerns."""
        if isinstance(msg, AddrMsg):
            addresses = self._addresses.setdefault(msg.index, [])
            if not msg.deleted and msg.address not in addresses:
                addresses.append(msg.address)
            elif msg.deleted and msg.address in addresses:
                addresses.remove(msg.address)
            return msg.index
        previous = self._links.get(msg.index)
        if previous is not None and previous.netdev != msg.name:  # renamed: the old name is gone
            self._report(LinkStatus(previous.netdev, present=False))
        if msg.deleted:
            self._addresses.pop(msg.index, None)
            self._links[msg.index] = LinkStatus(msg.name, present=False)
        else:
            self._links[msg.index] = LinkStatus(msg.name, True, msg.admin_up, msg.operstate, msg.carrier)
        return msg.index

    def _report_index(self, index: int) -> None:
        link = self._links.get(index)
        if link is None:
            return
        if not link.present:
            del self._links[index]  # ifindexes are reused; forget this one
        elif addresses := self._addresses.get(index):  # (not dataclasses.replace: the same, dearer)
            link = LinkStatus(
                link.netdev, True, link.admin_up, link.operstate, link.carrier, tuple(addresses)
            )
        self._report(link)

    def _report(self, link: LinkStatus) -> None:
        if self.netdevs is not None and link.netdev not in self.netdevs:
            return
        if self._reported.get(link.netdev) == link:
            return
        self._reported[link.netdev] = link
        log.debug("link %s", link)
        self.on_link(link)


@register("netlink")
def _from_config(config: MonitorsConfig, nics: NicTable) -> NetlinkMonitor | None:
    return NetlinkMonitor(nics.netdevs(), nics.link_changed) if config.netlink else None
