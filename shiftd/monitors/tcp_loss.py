"""The NICs' TCP retransmissions from sock_diag -> what each NIC sent and resent, every poll.

A lossy link shows nowhere in the link's state; it shows in the transport. Every poll this monitor dumps
the namespace's established TCP sockets with their tcp_info (NETLINK_SOCK_DIAG, as `ss -ti` does), takes
from each its data segments sent (tcpi_data_segs_out, retransmissions included) and its retransmissions
(tcpi_total_retrans), and adds what each socket sent since the last poll to the NIC whose address it is
bound to. The tcp provider's connections are such sockets, and so is any other TCP traffic over the NIC:
all of it is evidence of the link. The health machines' loss judges (shiftd/loss.py) decide what it means.

The first dump only sets the baseline (a socket's counters since its start say nothing of now); a socket
that appears later counts from zero, since it was not established at the last poll. On a kernel without
sock_diag for TCP (no inet_diag) the monitor says so once and stops; the other monitors go on.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, NamedTuple

from shiftd.monitors import register
from shiftd.monitors.netlink import NLMSG, RECV_BYTES, attributes

if TYPE_CHECKING:
    from shiftd.config import MonitorsConfig
    from shiftd.nics import NicTable

log = logging.getLogger(__name__)

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
INET_DIAG_INFO = 2
TCP_ESTABLISHED = 1
# inet_diag_req_v2: family, protocol, extensions wanted (a bit per attribute, INET_DIAG_INFO's is 1 << 1),
# pad, the states wanted (a bit per state), and a socket id left zero: a dump of every socket
DIAG_REQUEST = struct.Struct("=BBBxI48x")
# inet_diag_msg: family, 3 bytes of state; id: ports, source address (16 bytes, IPv4 in the first 4),
# destination, interface, cookie; then expires, queues, uid, inode
DIAG_MSG = struct.Struct("=B3x4x4s12x16x4xQ20x")
# tcp_info up to tcpi_data_segs_out (Linux 4.6): tcpi_total_retrans at 100, tcpi_data_segs_out at 156
TCP_INFO = struct.Struct("=100xI52xI")
INFO_ATTR = frozenset((INET_DIAG_INFO,))


class SocketCounts(NamedTuple):
    """One established TCP socket's counters: its source address, data segments sent, retransmitted."""

    cookie: int
    source: str
    segments: int
    retransmitted: int


class DiagError(OSError):
    """The kernel refused the dump (no sock_diag for TCP here, or no permission)."""


def dump_request(sequence: int) -> bytes:
    body = DIAG_REQUEST.pack(
        socket.AF_INET, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), 1 << TCP_ESTABLISHED
    )
    header = NLMSG.pack(NLMSG.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, sequence, 0)
    return header + body


def decode(data: bytes | bytearray) -> Iterator[SocketCounts | None]:
    """The sockets in one datagram of a dump's answer, and None at its end (NLMSG_DONE). A message too
    short for what is read from it is skipped, as is a socket without a whole tcp_info."""
    offset = 0
    while offset + NLMSG.size <= len(data):
        length, kind, _, _, _ = NLMSG.unpack_from(data, offset)
        if length < NLMSG.size or offset + length > len(data):
            return  # malformed or truncated
        body, end = offset + NLMSG.size, offset + length
        offset += (length + 3) & ~3
        if kind == NLMSG_DONE:
            yield None
            return
        if kind == NLMSG_ERROR:
            (error,) = struct.unpack_from("=i", data, body) if end - body >= 4 else (-1,)
            raise DiagError(-error, f"sock_diag refused the dump of TCP sockets: {_strerror(-error)}")
        if kind != SOCK_DIAG_BY_FAMILY or end - body < DIAG_MSG.size:
            continue
        family, source, cookie = DIAG_MSG.unpack_from(data, body)
        info = attributes(data, body + DIAG_MSG.size, end, INFO_ATTR).get(INET_DIAG_INFO)
        if family != socket.AF_INET or info is None or len(info) < TCP_INFO.size:
            continue
        retransmitted, segments = TCP_INFO.unpack_from(info)
        yield SocketCounts(cookie, socket.inet_ntop(socket.AF_INET, source), segments, retransmitted)


def _strerror(error: int) -> str:
    return os.strerror(error) if error > 0 else "malformed error message"


def sent_since(last: dict[int, SocketCounts], now: dict[int, SocketCounts]) -> dict[str, tuple[int, int]]:
    """Per source address, the (segments, retransmitted) its sockets sent between two dumps."""
    sent: dict[str, tuple[int, int]] = {}
    for cookie, counts in now.items():
        before = last.get(cookie)
        segments, retransmitted = counts.segments, counts.retransmitted
        if before is not None and before.segments <= segments and before.retransmitted <= retransmitted:
            segments, retransmitted = segments - before.segments, retransmitted - before.retransmitted
        total = sent.get(counts.source, (0, 0))
        sent[counts.source] = (total[0] + segments, total[1] + retransmitted)
    return sent


class TcpLossMonitor:
    """Dumps the TCP sockets every `interval` seconds and reports what each source address sent since the
    last dump to `on_sent`, every poll (the table gives each NIC its share, nothing included: a judge needs
    time to pass)."""

    def __init__(self, interval: float, on_sent: Callable[[dict[str, tuple[int, int]]], None]) -> None:
        self.interval = interval
        self.on_sent = on_sent
        self._sequence = 0
        self._buffer = bytearray(RECV_BYTES)  # one for every dump: a poll allocates nothing

    async def run(self) -> None:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_NONBLOCK, NETLINK_SOCK_DIAG)
        try:
            last = await self.dump(sock)
            while True:
                await asyncio.sleep(self.interval)
                now = await self.dump(sock)
                self.on_sent(sent_since(last, now))
                last = now
        except DiagError as exc:
            log.warning("%s: no loss judgement of the NICs' TCP traffic", exc)
        finally:
            sock.close()

    async def dump(self, sock: socket.socket) -> dict[int, SocketCounts]:
        """Every established TCP socket of the namespace, by cookie."""
        loop = asyncio.get_running_loop()
        self._sequence += 1
        await loop.sock_sendall(sock, dump_request(self._sequence))
        found: dict[int, SocketCounts] = {}
        while True:
            size = await loop.sock_recv_into(sock, self._buffer)
            for counts in decode(memoryview(self._buffer)[:size]):
                if counts is None:
                    return found
                found[counts.cookie] = counts


@register("tcp_loss")
def _from_config(config: MonitorsConfig, nics: NicTable) -> TcpLossMonitor | None:
    """Counts the TCP traffic of every NIC with an address; off when the config says so."""
    if not config.tcp_loss:
        return None
    return TcpLossMonitor(config.tcp_loss_poll_seconds, nics.traffic_sent)
