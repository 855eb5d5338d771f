"""Run code or commands inside a named network namespace (the ones `ip netns` keeps in /run/netns).

setns(2) moves only the calling thread, so Python code runs in a thread that enters the namespace
and leaves it again; the caller's own thread never moves. os.setns only arrived in Python 3.12,
hence ctypes. Commands go through `ip netns exec`, which also remounts /sys for the namespace so
that /sys/class/net shows the namespace's own netdevs, as shiftd's sysfs readers expect.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000

T = TypeVar("T")

_libc = ctypes.CDLL(None, use_errno=True)


class NetnsError(RuntimeError):
    """A namespace is missing or cannot be entered; str() is one line for the operator."""


def path(name: str) -> Path:
    return NETNS_DIR / name


def exists(name: str) -> bool:
    return path(name).exists()


def names() -> list[str]:
    """All named network namespaces, sorted."""
    try:
        return sorted(p.name for p in NETNS_DIR.iterdir())
    except FileNotFoundError:
        return []


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextmanager
def entered(name: str) -> Iterator[None]:
    """Move the calling thread into namespace `name` for the duration of the block."""
    try:
        target = os.open(path(name), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NetnsError(f"no network namespace {name!r}") from None
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


def run(name: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call fn(*args, **kwargs) in a thread inside namespace `name` and return its result.

    Sockets keep the namespace they were created in, so `run(ns, socket.socket)` hands back a
    socket of `ns` that the caller can use from any thread.
    """
    result: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            with entered(name):
                result.append(fn(*args, **kwargs))
        except BaseException as exc:
            error.append(exc)

    thread = threading.Thread(target=target, name=f"netns-{name}", daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def command(name: str, argv: Sequence[str]) -> list[str]:
    """The argv that runs `argv` inside namespace `name`."""
    return ["ip", "netns", "exec", name, *argv]
