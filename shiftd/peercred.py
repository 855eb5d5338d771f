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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

_UCRED = struct.Struct("3i")
_CHUNK = 1 << 18
PEER_PREFIX = "unix-abstract:"  # how gRPC spells a peer bound to an abstract address


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
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task] = set()

    @property
    def connections(self) -> int:
        return len(self._peers)

    async def start(self) -> None:
        path = Path(self.public_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        self._server = await asyncio.start_unix_server(self._accept, path=str(path), limit=_CHUNK)
        os.chmod(path, self.mode)
        gid = group_id(self.group)
        if gid is None:
            log.warning("group %r does not exist; %s keeps root's group", self.group, path)
        else:
            os.chown(path, -1, gid)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.public_path)
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def lookup(self, peer: str) -> PeerCred | None:
        """Credentials of the caller behind a gRPC `context.peer()` string."""
        name = peer.removeprefix(PEER_PREFIX)
        return self._peers.get(name)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        name = f"shiftd-{self._token}-{self._next_id}"
        self._next_id += 1
        try:
            cred = peer_cred(writer.get_extra_info("socket"))
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.bind("\0" + name)
            upstream.setblocking(False)
            try:
                await asyncio.get_running_loop().sock_connect(upstream, self.private_path)
            except OSError:
                upstream.close()
                raise
            self._peers[name] = cred
            up_reader, up_writer = await asyncio.open_unix_connection(sock=upstream, limit=_CHUNK)
            await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError) as exc:
            log.debug("relay %s ended: %s", name, exc)
        finally:
            if self._peers.pop(name, None) is not None and self._on_close is not None:
                self._on_close(PEER_PREFIX + name)
            writer.close()
            self._tasks.discard(task)


async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    """Copy one direction until EOF, then half-close so the other side sees the end."""
    try:
        while data := await src.read(_CHUNK):
            dst.write(data)
            await dst.drain()
        if dst.can_write_eof():
            dst.write_eof()
    except (ConnectionError, OSError):
        dst.close()
