"""A tcp context's QP numbers: each names the listener that reaches it, so a peer needs only GID and QPN.

RoCE reaches every QP of a device through one UDP port (4791) and tells them apart by the destination QPN in
each packet. One TCP port per device cannot be shared that way by the several processes that use a device
(eight training ranks to a NIC), so each context listens on ports of its own, bound to the device's netdev
(any address on it: a NIC re-addressed keeps its QPNs), and a QPN carries its listener's port: QPN = port << 8
| index, 256 QPs a listener, a new listener when those run out. The core accepts on the listeners and hands
each connection to the QP its HELLO names.
"""

from __future__ import annotations

import socket
from collections import deque
from collections.abc import Callable

PER_LISTENER = 256  # the 8 bits of a QPN under its port: 16 + 8 = IB's 24-bit QPN


class QpnSpace:
    """QPNs for a context's QPs, and the listeners behind them (made by `new_socket`, owned by the core)."""

    def __init__(self, new_socket: Callable[[], socket.socket], listen: Callable[[int], None]) -> None:
        self._new_socket = new_socket
        self._listen = listen
        self._free: deque[int] = deque()
        self.listeners: list[int] = []  # their fds (the core's): bound again when the netdev is made anew

    def take(self) -> int:
        if not self._free:
            self._open_listener()
        return self._free.popleft()

    def give_back(self, qpn: int) -> None:
        """A closed QP's number, reused last: a stale peer of the old QP then finds nobody for a while."""
        self._free.append(qpn)

    def _open_listener(self) -> None:
        sock = self._new_socket()
        try:
            sock.listen(socket.SOMAXCONN)
            port = sock.getsockname()[1]
        except OSError:
            sock.close()
            raise
        fd = sock.detach()
        self._listen(fd)  # the core owns it from here
        self.listeners.append(fd)
        self._free.extend(port << 8 | index for index in range(PER_LISTENER))
