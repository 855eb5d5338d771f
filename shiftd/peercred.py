"""The public Unix socket of shiftd, with the caller's identity from SO_PEERCRED.

gRPC Python gives a Unix-socket handler no peer credentials (context.peer() is just
"unix:"). So shiftd accepts connections itself, reads SO_PEERCRED, and relays each
connection to the gRPC server on a private socket (in a 0700 directory), connecting from an
abstract address that names the connection. The handler maps context.peer() back to the
credentials with `PeerCredRelay.lookup`. The relay is also where per-connection limits live.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import logging
import os
import secrets
import socket
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from shiftd.tasks import cancel_and_wait

log = logging.getLogger(__name__)

_UCRED = struct.Struct("3i")
PEER_PREFIX = "unix-abstract:"  # how gRPC spells a peer bound to an abstract address
RELAY_BUFFER = 65536  # bytes each side of a relayed connection reads at once


@dataclass(frozen=True)
class PeerCred:
    """Who is on the other end of a connection, as the kernel vouches for it."""

    pid: int
    uid: int
    gid: int
    groups: frozenset[int] = field(default_factory=frozenset)

    def in_group(self, gid: int) -> bool:
        return self.gid == gid or gid in self.groups


def peer_cred(sock: socket.socket) -> PeerCred:
    """SO_PEERCRED of a connected Unix socket, with the supplementary groups of the caller."""
    pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return PeerCred(pid, uid, gid, _supplementary_groups(pid))


def _supplementary_groups(pid: int) -> frozenset[int]:
    # SO_PEERCRED carries only the primary gid; the kernel's view of the rest is in /proc.
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Groups:"):
                return frozenset(int(g) for g in line.split()[1:])
    except (OSError, ValueError):
        pass
    return frozenset()


def group_id(name: str) -> int | None:
    """The gid of a group name, or None when the group does not exist on this host."""
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None


class _Splice(asyncio.BufferedProtocol):
    """One side of a relayed connection: what it receives is written to the other side at once.

    Protocols rather than streams: no task wake-up per chunk between the two sockets, which is
    what an agent's NIC event pays on its way through the relay. A buffered protocol: each side
    receives into a buffer of its own, where a plain protocol would allocate (mmap) and shrink a
    256 KiB bytes object for every message. Flow control is passed across: when one side's send
    buffer fills, the other side stops reading.
    """

    def __init__(
        self,
        on_made: Callable[[_Splice], None] = lambda splice: None,
        on_lost: Callable[[_Splice], None] = lambda splice: None,
        sock: socket.socket | None = None,
    ) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Splice | None = None
        self.sock = sock  # the relay's own socket to gRPC, which pump() reads
        self.ended = False  # the other end of this socket will send no more
        self._on_made = on_made
        self._on_lost = on_lost
        self._buffer = memoryview(bytearray(RELAY_BUFFER))

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._on_made(self)

    def join(self, peer: _Splice) -> None:
        self.peer, peer.peer = peer, self

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        assert self.peer is not None and self.peer.transport is not None  # reading starts once joined
        # a copy: what the transport cannot send at once it keeps, and the buffer is read into again
        self.peer.transport.write(bytes(self._buffer[:nbytes]))

    def pump(self) -> bool:
        """Relay what the socket holds now, without waiting for the event loop to find it readable;
        whether anything went.

        The loop and this read share one thread and one socket object, so the bytes go out in the order
        they came whoever reads them; the loop's own read then finds nothing (EAGAIN), and an end of
        stream (a read of 0 bytes) is left for it to find again, as it always finds one.
        """
        transport, peer = self.transport, self.peer
        if self.sock is None or transport is None or transport.is_closing():
            return False
        if peer is None or peer.transport is None or peer.transport.is_closing():
            return False
        relayed = False
        # not while paused: the peer's buffer is full (and writing here may fill it, pausing this side)
        while transport.is_reading():
            try:
                nbytes = self.sock.recv_into(self._buffer)
            except OSError:  # nothing more now (EAGAIN), or an error the loop's read will meet too
                break
            if nbytes == 0:
                break
            self.buffer_updated(nbytes)
            relayed = True
        return relayed

    def eof_received(self) -> bool:
        self.ended = True
        peer = self.peer
        if peer is None or peer.transport is None or peer.ended:  # both directions are done
            if peer is not None and peer.transport is not None:
                peer.transport.close()
            return False  # asyncio closes this transport
        if peer.transport.can_write_eof():
            peer.transport.write_eof()
        return True  # half-close: keep sending what the other side still has to say

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()
        self._on_lost(self)


class PeerCredRelay:
    """Accepts on `public_path`, relays to the gRPC server at `private_path`."""

    def __init__(
        self,
        public_path: str,
        private_path: str,
        mode: int,
        group: str,
        on_close: Callable[[str], None] | None = None,
    ) -> None:
        self.public_path = public_path
        self._on_close = on_close
        self.private_path = private_path
        self.mode = mode
        self.group = group
        self._token = secrets.token_hex(6)
        self._next_id = 0
        self._peers: dict[str, PeerCred] = {}
        self._live: set[_Splice] = set()
        self._server: asyncio.AbstractServer | None = None
        self._held = False  # the socket was passed by a holder that keeps it across restarts
        self._tasks: set[asyncio.Task] = set()

    @property
    def connections(self) -> int:
        return len(self._peers)

    async def start(self, held: socket.socket | None = None) -> None:
        """Serve on the public socket: `held` when its holder (systemd, the lab's supervisor) passed it,
        which outlives this daemon; else one bound here, which goes with it."""
        path = Path(self.public_path)
        self._held = held is not None
        if held is None:
            path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            # bound, given its mode and group, and only then listening: no caller ever reaches it with other
            # permissions (a client, or systemd's readiness, may connect the moment it listens)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(str(path))
        else:
            sock = held  # the holder bound it 0600 or as its unit says; the config's mode and group win
        os.chmod(path, self.mode)
        gid = group_id(self.group)
        if gid is None:
            log.warning("group %r does not exist; %s keeps root's group", self.group, path)
        else:
            os.chown(path, -1, gid)
        # from Python 3.13 on, asyncio removes a Unix server's path when it closes: not a held socket's
        keep = {"cleanup_socket": False} if self._held and sys.version_info >= (3, 13) else {}
        self._server = await asyncio.get_running_loop().create_unix_server(self._accepted, sock=sock, **keep)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()  # a held socket stays open in its holder: callers wait in its backlog
            if not self._held:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.public_path)
        await cancel_and_wait(self._tasks)
        for splice in list(self._live):
            if splice.transport is not None:
                splice.transport.close()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def pump(self) -> None:
        """Relay at once what gRPC has just written to the callers (a NIC event on the agents' streams).

        gRPC writes a stream message to its end of the relay on the event loop's thread, inside the call
        that hands it over; the loop would come back to the relay's read only after the rest of its turn
        (0.2-0.4 ms on this path, measured with ftrace). Reading here instead saves that turn.

        Then the CPU is given up once: a Unix socket wakes its reader on the writer's CPU, expecting the
        writer to sleep, and the daemon would otherwise keep the agent waiting through the rest of its turn
        (about 0.1 ms here, even with the other core idle).
        """
        relayed = False
        for downstream in list(self._live):  # a write that fails ends its connection later, not now
            if downstream.peer is not None:
                relayed = downstream.peer.pump() or relayed
        if relayed:
            os.sched_yield()

    def lookup(self, peer: str) -> PeerCred | None:
        """Credentials of the caller behind a gRPC `context.peer()` string."""
        name = peer.removeprefix(PEER_PREFIX)
        return self._peers.get(name)

    def _accepted(self) -> _Splice:
        """A new caller: hold its bytes until the relay's own connection to gRPC is up."""
        name = f"shiftd-{self._token}-{self._next_id}"
        self._next_id += 1
        return _Splice(
            on_made=lambda splice: self._made(name, splice), on_lost=lambda splice: self._lost(name, splice)
        )

    def _made(self, name: str, downstream: _Splice) -> None:
        assert downstream.transport is not None
        downstream.transport.pause_reading()
        self._live.add(downstream)
        task = asyncio.get_running_loop().create_task(self._connect_upstream(name, downstream))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connect_upstream(self, name: str, downstream: _Splice) -> None:
        assert downstream.transport is not None
        upstream_sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            cred = peer_cred(downstream.transport.get_extra_info("socket"))
            upstream_sock.bind("\0" + name)
            upstream_sock.setblocking(False)
            loop = asyncio.get_running_loop()
            await loop.sock_connect(upstream_sock, self.private_path)
            upstream = _Splice(sock=upstream_sock)
            await loop.create_unix_connection(lambda: upstream, sock=upstream_sock)
        except OSError as exc:
            log.warning("relay %s: cannot reach the gRPC server: %s", name, exc)
            upstream_sock.close()
            downstream.transport.close()
            return
        if downstream.transport.is_closing():  # the caller left while we connected
            upstream.transport.close()
            return
        self._peers[name] = cred
        downstream.join(upstream)
        downstream.transport.resume_reading()

    def _lost(self, name: str, downstream: _Splice) -> None:
        self._live.discard(downstream)
        if self._peers.pop(name, None) is not None and self._on_close is not None:
            self._on_close(PEER_PREFIX + name)
