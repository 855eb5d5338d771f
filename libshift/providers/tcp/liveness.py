"""TCP's view of a path, for the ack deadline: the signal an RNIC's per-packet ACKs give its retry timer.

An RNIC acks each packet as it lands, whatever the remote CPU is doing, so its retry timer runs out only
when the path is dead. The tcp provider acks a request once the remote process has placed it, which a busy
remote host, or a transfer of many megabytes, can delay past a short deadline. The remote kernel's TCP
acks are the packet-level signal: while it keeps acknowledging new bytes, or has none of ours left to
acknowledge, or holds its window shut and answers our window probes, the path is alive and the wait is on
the remote host. A black hole or a dead link shows as none of these.
"""

from __future__ import annotations

import fcntl
import socket
import struct
import termios

_INFO_LEN = 232  # struct tcp_info up to tcpi_snd_wnd (Linux 5.4); older kernels return less
_PROBES = 3  # u8 tcpi_probes: unanswered zero-window probes
_BYTES_ACKED = struct.Struct("=Q")  # u64 tcpi_bytes_acked at 120 (Linux 4.1)
_SND_WND = struct.Struct("=I")  # u32 tcpi_snd_wnd at 228
_INT = struct.Struct("=i")


class PathWatch:
    """Looks at one socket once per retry period: has the remote kernel shown life since the last look?"""

    __slots__ = ("_mark",)

    def __init__(self) -> None:
        self._mark: int | None = None  # tcpi_bytes_acked at the last look; None: no look since progress

    def reset(self) -> None:
        """Verbs-level progress was made: the next look has nothing to compare with yet."""
        self._mark = None

    def alive(self, sock: socket.socket) -> bool | None:
        """Whether the path showed life since the last look; None when this look has nothing to compare
        with (the first since a reset, with bytes still unacknowledged)."""
        try:
            unacked = _INT.unpack(fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _INFO_LEN)
        except OSError:
            return False
        if unacked == 0:
            return True  # everything we wrote is acknowledged
        window_shut = len(info) >= _INFO_LEN and _SND_WND.unpack_from(info, 228)[0] == 0
        if window_shut and info[_PROBES] == 0:
            return True
        if len(info) < 128:
            return False  # no tcpi_bytes_acked: only the verbs-level acks count
        acked = _BYTES_ACKED.unpack_from(info, 120)[0]
        mark, self._mark = self._mark, acked
        if mark is None:
            return None
        return acked > mark
