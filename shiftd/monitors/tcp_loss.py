"""The NICs' TCP traffic from sock_diag -> what each NIC sent, resent and had acknowledged, every poll.

A lossy or slow link shows nowhere in the link's state; it shows in the transport. Every poll this monitor
dumps the namespace's established TCP sockets with their tcp_info (NETLINK_SOCK_DIAG, as `ss -ti` does),
takes from each its data segments sent (tcpi_data_segs_out, retransmissions included), its
retransmissions (tcpi_total_retrans) and the bytes its peer acknowledged (tcpi_bytes_acked), and adds what
each socket did since the last poll to the NIC whose address it is bound to; the segments and
retransmissions also by the peer's address, so that a judge can tell a NIC that loses towards every peer
from a peer whose own link loses. The bytes acknowledged count
twice: all of them, and those of sockets the network held back: not the application (the kernel's
tcpi_delivery_rate_app_limited clear, and at the poll a backlog: bytes not yet sent, tcpi_notsent_bytes,
or a full congestion window, tcpi_unacked at tcpi_snd_cwnd; small messages, each sent whole, have
neither, though their last rate sample may not say so), and not the receiver (the window the peer
advertises, tcpi_snd_wnd, is not nearly closed: a peer slow to read is no slow link; a deep queue on the
way keeps it open). The tcp provider's connections are such sockets, and so
is any other TCP traffic over the NIC: all of it is evidence of the link. The health machines' judges
decide what it means: the loss judge (shiftd/loss.py) and the speed judge (shiftd/slow.py).

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
from shiftd.nic import PeerTraffic, Traffic, combined

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
# destination (the same), interface, cookie; then expires, queues, uid, inode
DIAG_MSG = struct.Struct("=B3x4x4s12x4s12x4xQ20x")
# tcp_info up to tcpi_data_segs_out (Linux 4.6): the flags byte with tcpi_delivery_rate_app_limited (its
# bit 0) at 7, tcpi_unacked at 24, tcpi_snd_cwnd at 80, tcpi_total_retrans at 100, tcpi_bytes_acked at 120,
# tcpi_notsent_bytes at 144, tcpi_data_segs_out at 156
TCP_INFO = struct.Struct("=7xB16xI52xI16xI16xQ16xI8xI")
APP_LIMITED = 0x1
# and beyond it, read when there: tcpi_busy_time at 168 and tcpi_rwnd_limited at 176 (Linux 4.10), the
# microseconds the socket had data in flight and of those the ones the peer's window held it (its reader was
# slow: not the network's time), and tcpi_snd_wnd at 228 (Linux 5.4), the window the peer advertises
BUSY_TIME = struct.Struct("=168xQQ")
PEER_WINDOW = struct.Struct("=228xI")
WINDOW_CLOSED = 64 << 10  # a peer advertising less is reading slower than it is sent to
INFO_ATTR = frozenset((INET_DIAG_INFO,))


class SocketCounts(NamedTuple):
    """One established TCP socket's counters: its source address, data segments sent, retransmitted, the
    bytes acknowledged, and whether its last rate sample was the application's doing (it ran out of data)."""

    cookie: int
    source: str
    segments: int
    retransmitted: int
    acked: int
    app_limited: bool
    peer_window: int | None = None  # the window its peer advertises (None: a kernel before 5.4)
    busy_us: int | None = None  # microseconds the network had its data in flight (None: before Linux 4.10)
    backlogged: bool = True  # at the dump, bytes not yet sent or a full congestion window
    peer: str = ""  # the address it is connected to


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
        family, source, destination, cookie = DIAG_MSG.unpack_from(data, body)
        info = attributes(data, body + DIAG_MSG.size, end, INFO_ATTR).get(INET_DIAG_INFO)
        if family != socket.AF_INET or info is None or len(info) < TCP_INFO.size:
            continue
        flags, unacked, cwnd, retransmitted, acked, notsent, segments = TCP_INFO.unpack_from(info)
        window = PEER_WINDOW.unpack_from(info)[0] if len(info) >= PEER_WINDOW.size else None
        busy = None
        if len(info) >= BUSY_TIME.size:
            in_flight, reader_held = BUSY_TIME.unpack_from(info)
            busy = max(in_flight - reader_held, 0)
        source_address, peer = (socket.inet_ntop(socket.AF_INET, a) for a in (source, destination))
        app_limited = bool(flags & APP_LIMITED)
        backlogged = notsent > 0 or unacked >= cwnd > 0
        counts = (segments, retransmitted, acked, app_limited, window, busy, backlogged)
        yield SocketCounts(cookie, source_address, *counts, peer)


def _strerror(error: int) -> str:
    return os.strerror(error) if error > 0 else "malformed error message"


def sent_since(last: dict[int, SocketCounts], now: dict[int, SocketCounts]) -> dict[str, Traffic]:
    """Per source address, what its sockets did between two dumps (a new socket: since it began)."""
    sockets: dict[str, list[Traffic]] = {}  # by source, what each socket did
    for cookie, counts in now.items():
        done = _counters(counts)
        before = last.get(cookie)
        if before is not None:
            done_before = _counters(before)
            if all(b <= n for b, n in zip(done_before, done, strict=True)):
                done = tuple(n - b for b, n in zip(done_before, done, strict=True))
        segments, retransmitted, acked, busy_us = done
        reader_slow = counts.peer_window is not None and counts.peer_window < WINDOW_CLOSED
        in_flight = counts.busy_us is None or busy_us > 0  # 0: what it sent waited for its reader only
        held = not counts.app_limited and counts.backlogged and not reader_slow and acked > 0 and in_flight
        limited, busy = (acked, busy_us / 1e6) if held else (0, 0.0)
        share = PeerTraffic(counts.peer, segments, retransmitted, limited, busy)
        peers = (share,) if counts.peer and (segments or limited) else ()
        sockets.setdefault(counts.source, []).append(
            Traffic(segments, retransmitted, acked, limited, busy, peers)
        )
    return {source: combined(shares) for source, shares in sockets.items()}


def _counters(counts: SocketCounts) -> tuple[int, ...]:
    """What grows in a socket's counts: segments sent, retransmitted, bytes acknowledged, microseconds busy
    (0 where the kernel does not say)."""
    return (counts.segments, counts.retransmitted, counts.acked, counts.busy_us or 0)


class TcpLossMonitor:
    """Dumps the TCP sockets every `interval` seconds and reports what each source address sent since the
    last dump to `on_sent`, every poll (the table gives each NIC its share, nothing included: a judge needs
    time to pass)."""

    def __init__(self, interval: float, on_sent: Callable[[dict[str, Traffic]], None]) -> None:
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
