"""Run code or commands inside a named network namespace (the ones `ip netns` keeps in /run/netns).

setns(2) moves only the calling thread, so Python code runs in a thread that enters the namespace
and leaves it again; the caller's own thread never moves (setns itself is libshift.netns's, which
the in-process library needs too). Commands go through `ip netns exec`, which also remounts /sys
for the namespace so that /sys/class/net shows the namespace's own netdevs, as shiftd's sysfs
readers expect.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from libshift.netns import NETNS_DIR as _NETNS_DIR
from libshift.netns import NetnsError as NetnsError
from libshift.netns import entered as entered

NETNS_DIR = Path(_NETNS_DIR)

T = TypeVar("T")


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
