"""Waiting on a device's event files without holding the GIL, and ending such a wait from another thread."""

from __future__ import annotations

import os
import select
from collections.abc import Sequence
from contextlib import suppress


def wait_readable(fds: Sequence[int], timeout: float | None) -> list[int]:
    """The descriptors of `fds` that are readable (or in error), waiting up to `timeout` s (None: forever);
    one closed meanwhile is left out."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    millis = None if timeout is None else max(0, int(timeout * 1000 + 0.999))
    return [fd for fd, mask in poller.poll(millis) if not mask & select.POLLNVAL]


class Waker:
    """A pipe whose read end, added to a wait, lets another thread end the wait (close, shutdown)."""

    def __init__(self) -> None:
        self.fd, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def wake(self) -> None:
        with suppress(BlockingIOError):  # already woken
            os.write(self._write, b"x")

    def clear(self) -> None:
        with suppress(BlockingIOError):
            while os.read(self.fd, 64):
                pass

    def close(self) -> None:
        os.close(self.fd)
        os.close(self._write)
