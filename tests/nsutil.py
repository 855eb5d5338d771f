"""Test helpers for network namespaces: create one, and run an asyncio loop inside it.

The loop's thread enters the namespace (shiftlab.netns.entered, setns(2) through ctypes), so
every socket it opens (netlink, uevent) belongs to that namespace: that is how the monitors
are tested against real links without touching the host's interfaces.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import subprocess
import threading
from collections.abc import Coroutine, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from shiftlab.netns import NetnsError
from shiftlab.netns import entered as netns_entered

_names = itertools.count()

T = TypeVar("T")


def ip(*args: str) -> None:
    """Run `ip ARGS`, failing loudly with ip's own message."""
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
    if proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


@contextmanager
def netns(prefix: str) -> Iterator[str]:
    """A fresh, uniquely named namespace (prefix + pid + counter), deleted on exit."""
    name = f"{prefix}{os.getpid()}x{next(_names)}"
    ip("netns", "add", name)
    try:
        yield name
    finally:
        ip("netns", "del", name)


def open_sockets() -> set[str]:
    """This process's open sockets, as /proc/self/fd names them: a monitor must close its own."""
    sockets = set()
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):  # the fd of the listing itself is gone by now
            link = os.readlink(fd)
            if link.startswith("socket:"):
                sockets.add(link)
    return sockets


class NetnsLoop:
    """An asyncio event loop running in a thread that lives in a network namespace."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._ready: Future[None] = Future()
        self._thread = threading.Thread(target=self._main, args=(name,), daemon=True)

    def __enter__(self) -> NetnsLoop:
        self._thread.start()
        self._ready.result(timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()

    def _main(self, name: str) -> None:
        try:
            with netns_entered(name):
                asyncio.set_event_loop(self.loop)
                self.loop.call_soon(self._ready.set_result, None)
                self.loop.run_forever()
        except (OSError, NetnsError) as exc:
            self._ready.set_exception(exc)

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Start a coroutine on the namespaced loop; its Future resolves when it ends."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 10) -> T:
        """Run a coroutine on the namespaced loop and wait for its result."""
        return self.submit(coro).result(timeout=timeout)
