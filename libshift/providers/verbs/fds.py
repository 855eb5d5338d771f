"""The event files of a device, found and waited on without holding the GIL.

pyverbs' blocking calls (CompChannel.get_cq_event, Context.get_async_event) hold the GIL while they block,
which would stop every other thread of the process, and pyverbs exposes neither file descriptor. So the
provider finds each one as the event file ("anon_inode:[infinibandevent]") that appeared while the object
was created (creations are serialized by one lock), waits on it with poll() (which releases the GIL),
and calls pyverbs only once the file is readable, when the call returns at once.
"""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass

from libshift.vocabulary.errors import VerbsError

EVENT_FILE = "anon_inode:[infinibandevent]"
_creating = threading.Lock()


def fds_linked_to(target: str, fd_dir: str = "/proc/self/fd") -> set[int]:
    """This process's descriptors whose /proc link reads `target`."""
    found = set()
    for name in os.listdir(fd_dir):
        try:
            if os.readlink(f"{fd_dir}/{name}") == target:
                found.add(int(name))
        except OSError:  # closed meanwhile (the listing's own descriptor, or another thread's)
            continue
    return found


@dataclass
class NewFd:
    """Filled by `new_fd`: the one descriptor of the target kind created inside the block."""

    fd: int | None = None
    error: str = ""


@contextmanager
def new_fd(what: str, target: str = EVENT_FILE) -> Iterator[NewFd]:
    """Find the descriptor of kind `target` that the block creates; `error` says why when none or several
    appeared (then `fd` stays None and the caller decides whether that is fatal)."""
    found = NewFd()
    with _creating:
        before = fds_linked_to(target)
        yield found
        appeared = fds_linked_to(target) - before
    if len(appeared) == 1:
        found.fd = appeared.pop()
    else:
        found.error = f"{what}: {len(appeared)} new event files appeared, expected one"


def require(found: NewFd) -> int:
    if found.fd is None:
        raise VerbsError(found.error)
    return found.fd


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
