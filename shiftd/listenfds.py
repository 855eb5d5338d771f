"""The listening socket systemd (shiftd.socket) or the lab's supervisor holds across shiftd's restarts.

Socket activation, as sd_listen_fds(3) defines it: LISTEN_PID names this process, LISTEN_FDS counts the
sockets passed from fd 3 on. The holder keeps the socket open while shiftd is away, so an agent's connect
waits in its backlog instead of failing, and the new daemon answers it the moment it serves. The variables
are removed from the environment once read, so that no child (tc, say) takes the socket for its own.
"""

from __future__ import annotations

import os
import socket
from collections.abc import MutableMapping

LISTEN_FDS_START = 3


class ListenError(Exception):
    """The passed socket cannot be shiftd's; str() says why, for the operator."""


def inherited_socket(path: str, environ: MutableMapping[str, str] = os.environ) -> socket.socket | None:
    """The Unix stream socket listening on `path` that was passed to this process, or None when none was."""
    pid, count = environ.pop("LISTEN_PID", ""), environ.pop("LISTEN_FDS", "")
    environ.pop("LISTEN_FDNAMES", None)
    if not pid.isdigit() or int(pid) != os.getpid() or not count.isdigit() or int(count) < 1:
        return None
    if int(count) > 1:
        raise ListenError(f"{count} sockets passed (LISTEN_FDS); shiftd listens on one, {path}")
    sock = socket.socket(fileno=LISTEN_FDS_START)
    sock.set_inheritable(False)
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        sock.close()
        raise ListenError("the passed socket is not a Unix stream socket (ListenStream= a path)")
    bound = sock.getsockname()
    if bound != path:
        sock.close()
        raise ListenError(f"the passed socket listens on {bound!r}, server.socket is {path!r}")
    return sock
