"""Network namespaces: run code inside one (`entered`, `in_netns`).

Linux keeps the network namespace per thread and a socket keeps the namespace it was created in, so creating
a Context's sockets inside `in_netns(...)` puts that device on another lab host while the rest of the process
stays where it was. Python 3.11 has no os.setns, hence ctypes.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from contextlib import contextmanager

CLONE_NEWNET = 0x40000000
NETNS_DIR = "/run/netns"
_libc = ctypes.CDLL(None, use_errno=True)


class NetnsError(RuntimeError):
    """A namespace is missing or cannot be entered; str() is one line for the operator."""


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise NetnsError(f"cannot enter network namespace: {os.strerror(err)}")


def _open(name: str) -> int:
    path = name if name.startswith("/") else os.path.join(NETNS_DIR, name)
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise NetnsError(f"network namespace {name!r} not found ({exc.strerror})") from None


@contextmanager
def _inside(target: int) -> Iterator[None]:
    """setns into the namespace open as `target` for the block, then back; closes `target`."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(target)
        os.close(own)


@contextmanager
def entered(name: str) -> Iterator[None]:
    """Move the calling thread into namespace `name` (a name in /run/netns, or a path) for the block."""
    with _inside(_open(name)):
        yield


@contextmanager
def in_netns(name: str | None) -> Iterator[None]:
    """`entered(name)`, or stay where the thread is for None (a device without `@netns`)."""
    if name is None:
        yield
        return
    with entered(name):
        yield
