"""The context's own NIC event source: the kernel's word on the links of its netdevs (DESIGN 4b).

shiftd's NIC event reaches a context through the daemon's netlink monitor, its health decision and the
agent's gRPC stream: 0.5 to 1 ms after the kernel's message on a quiet host, more under load. The kernel
multicasts the same link message to every socket that listens, so the context listens too, and a link that
loses its carrier, goes down or is removed moves the QPs at once. Whichever word comes first acts; the later
one finds nothing left to do. Only DOWN is taken from here: UP stays shiftd's, whose flap damping decides
when a link that came back can be trusted.

One NETLINK_ROUTE socket per network namespace of the netdevs (an ifindex means something only in its
namespace), read by the core (linkwatch.c) on one thread that waits without the interpreter lock. Before
that thread takes the lock again, the core raises the mark of each link seen down (a bit of the context's
fast path, `marks`) and moves the QPs in their steady state off it, in C, on this thread
(fast_switch.c): the call to `on_down` comes after, when the lock is had, for what the core left to the
failover layer. The
watch knows the ifindex each netdev had when it started: a netdev removed and made again is shiftd's to see.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import threading
from collections.abc import Callable

from libshift.core._core import link_next, prefer_latency
from libshift.netns import NetnsError, in_netns

log = logging.getLogger("libshift.shift")
RTMGRP_LINK = 1
RECEIVE_BUFFER = 1 << 20  # a burst of link messages (a host's NICs bouncing together) must not be dropped

Netdev = tuple[str, str | None]  # (netdev, network namespace or None for the thread's own)
Mark = tuple[int, int, int, int]  # FastContext.link_mark: raised in C, and acted on, when the link fails


class LinkWatch:
    """Calls `on_down(key, seen_ns)` on its own thread when the link of the netdev named for `key` stops
    carrying traffic (seen_ns: when the watch read it, CLOCK_MONOTONIC), once per failure (the kernel says
    it in several messages: the carrier, then the operstate). `netdevs` maps each key to its (netdev,
    namespace); a netdev that cannot be found is left out, with a warning. `marks` maps a key to the mark
    the core raises, and acts on, without the interpreter lock, before that call."""

    def __init__(
        self,
        netdevs: dict[str, Netdev],
        on_down: Callable[[str, int], None],
        name: str,
        marks: dict[str, Mark] | None = None,
    ) -> None:
        self._on_down = on_down
        self._marks = marks or {}
        self._sockets: list[socket.socket] = []
        self._keys: dict[tuple[int, int], str] = {}  # (socket index, ifindex) -> key
        self._down: set[str] = set()  # keys told down whose link has not been up since
        by_netns: dict[str | None, int] = {}
        for key, (netdev, netns) in netdevs.items():
            try:
                with in_netns(netns):
                    ifindex = socket.if_nametoindex(netdev)
                    if netns not in by_netns:
                        by_netns[netns] = len(self._sockets)
                        self._sockets.append(_link_socket())
            except (OSError, NetnsError) as exc:
                log.warning("%s: no link watch on %s (%s); shiftd still tells", name, netdev, exc)
                continue
            self._keys[(by_netns[netns], ifindex)] = key
        self._wake = os.eventfd(0, os.EFD_CLOEXEC)
        self._thread = threading.Thread(target=self._run, name=f"libshift-{name}-links", daemon=True)
        if self._keys:
            self._thread.start()

    @property
    def watched(self) -> set[str]:
        """The keys whose links are watched."""
        return set(self._keys.values())

    def _run(self) -> None:
        prefer_latency()  # woken by a link message, act at once, even with busy pollers on every CPU
        fds = [sock.fileno() for sock in self._sockets]
        watched = [(*link, self._marks.get(key)) for link, key in self._keys.items()]
        while True:
            try:
                woken, events, failures, seen_ns = link_next(fds, self._wake, watched)
            except OSError as exc:
                log.warning("link watch stopped: %s", exc)
                return
            if woken:
                return
            for _source, error in failures:
                if error != errno.ENOBUFS:
                    log.warning("link watch stopped: %s", os.strerror(error))
                    return
                log.info("link watch: the kernel dropped link messages; shiftd's word stands for them")
            for found, ifindex, up, _gone in events:
                key = self._keys[(found, ifindex)]
                if up:
                    self._down.discard(key)
                elif key not in self._down:
                    self._down.add(key)
                    self._tell(key, seen_ns)

    def _tell(self, key: str, seen_ns: int) -> None:
        try:
            self._on_down(key, seen_ns)
        except Exception:  # the watch must outlive one failed reaction: the next link event still counts
            log.exception("link watch: acting on %s's link going down failed", key)

    def close(self) -> None:
        os.eventfd_write(self._wake, 1)
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        os.close(self._wake)
        for sock in self._sockets:
            sock.close()


def _link_socket() -> socket.socket:
    """A non-blocking NETLINK_ROUTE socket on the link group, in the thread's namespace."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC,
                         socket.NETLINK_ROUTE)  # fmt: skip
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        sock.bind((0, RTMGRP_LINK))
    except OSError:
        sock.close()
        raise
    return sock
