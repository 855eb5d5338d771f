"""The progress engine: one thread per Context that waits in epoll and drives every socket and timer.

All transport state of a Context is guarded by `engine.lock`. The application's threads take it too, so a
post can write to the socket at once instead of waiting for this thread (fewer thread switches on 2 cores);
this thread only sleeps in epoll without the lock. A handler that raises must never stop the engine: the
error is handed to the handler's owner (its QP goes to ERR) and recorded in `failures`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

Handler = Callable[[int], None]
ErrorHandler = Callable[[BaseException], None]


class Engine:
    def __init__(self, name: str) -> None:
        self.lock = threading.RLock()
        self.failures: list[BaseException] = []
        self._selector = selectors.DefaultSelector()
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._selector.register(self._wake_fd, selectors.EVENT_READ, None)
        self._timers: dict[object, tuple[float, Callable[[], None], ErrorHandler | None]] = {}
        self._sleep_until = 0.0  # when the engine's current wait in epoll ends by itself
        self._errors: dict[int, ErrorHandler] = {}
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"shift-tcp-{name}", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def watch(
        self, fd: int, events: int, handler: Handler, on_error: Callable[[BaseException], None]
    ) -> None:
        """Call handler(mask) when fd is ready for `events` (register or change); caller holds the lock."""
        self._errors[fd] = on_error
        try:
            self._selector.modify(fd, events, handler)
        except KeyError:
            self._selector.register(fd, events, handler)

    def unwatch(self, fd: int) -> None:
        self._errors.pop(fd, None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(fd)

    def set_timer(
        self,
        owner: object,
        deadline: float | None,
        callback: Callable[[], None],
        on_error: ErrorHandler | None = None,
    ) -> None:
        """Arm (or with None, cancel) the one timer of `owner`; callback runs on this thread with the lock.

        The engine is woken only when the new deadline comes before the end of its current wait: a wake-up
        costs a thread switch and a fight for the interpreter lock, which shows in every round trip.
        """
        if deadline is None:
            self._timers.pop(owner, None)
            return
        self._timers[owner] = (deadline, callback, on_error)
        if deadline < self._sleep_until and threading.current_thread() is not self._thread:
            self.wake()

    def wake(self) -> None:
        os.eventfd_write(self._wake_fd, 1)

    def stop(self) -> None:
        self._stopping = True
        self.wake()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
        self._selector.close()
        os.close(self._wake_fd)

    def _timeout(self) -> float | None:
        if not self._timers:
            self._sleep_until = float("inf")
            return None
        self._sleep_until = min(deadline for deadline, _, _ in self._timers.values())
        return max(0.0, self._sleep_until - time.monotonic())

    def _run(self) -> None:
        while not self._stopping:
            with self.lock:
                timeout = self._timeout()
            try:
                events = self._selector.select(timeout)
            except (OSError, ValueError):
                if self._stopping:
                    return
                raise
            with self.lock:
                if self._stopping:
                    return
                self._dispatch(events)

    def poll_once(self) -> None:
        """One non-blocking pass on the caller's thread, unless another thread is making progress now.

        An application that busy-polls its CQ thereby moves its own data: no wake-up of this engine's
        thread and no hand-over of the interpreter lock sits between the wire and the completion. Events
        seen here may be seen again by the engine thread; every handler finds nothing to do the second time.
        """
        if self._stopping or not self.lock.acquire(blocking=False):
            return
        try:
            self._dispatch(self._selector.select(0))
        finally:
            self.lock.release()

    def _dispatch(self, events: list[tuple[selectors.SelectorKey, int]]) -> None:
        for key, mask in events:
            if key.data is None:
                self._drain_wake()
            else:
                self._call(key.fd, key.data, mask)
        self._fire_timers()

    def _drain_wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self._wake_fd)

    def _call(self, fd: int, handler: Handler, mask: int) -> None:
        try:
            handler(mask)
        except Exception as exc:
            self._fail(self._errors.get(fd), exc)

    def _fire_timers(self) -> None:
        now = time.monotonic()
        due = [(owner, timer) for owner, timer in self._timers.items() if timer[0] <= now]
        for owner, timer in due:
            if self._timers.get(owner) is timer:
                del self._timers[owner]
            try:
                timer[1]()
            except Exception as exc:
                self._fail(timer[2], exc)

    def _fail(self, on_error: ErrorHandler | None, exc: BaseException) -> None:
        log.exception("tcp provider: handler failed", exc_info=exc)
        self.failures.append(exc)
        if on_error is not None:
            try:
                on_error(exc)
            except Exception as again:
                self.failures.append(again)
