"""The progress engine of a Context: whoever holds the lead waits in epoll and drives every socket and timer.

All transport state of a Context is guarded by `engine.lock`; a post takes it and writes to the socket at
once. Waiting in epoll is a separate role, the lead, held by one thread at a time (leader/follower). An
application thread that blocks for a completion takes the lead itself, so the bytes it waits for are read,
placed, acknowledged and completed on its own thread: no wake-up of another thread and no hand-over of the
interpreter lock sits between the wire and the completion (each hand-over costs tens of microseconds on a
busy 2-core box). An application thread that polls a CQ makes a non-blocking pass itself (poll_once). The
engine's own thread leads whenever no application thread has led or polled for GRACE, so acks, responder
work and timers still flow while the application is away; meanwhile it parks, off epoll and off the lock, so
that it does not race the application to every frame. A handler that raises never stops the engine: the
error is handed to the handler's owner (its QP goes to ERR) and recorded in `failures`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import operator
import os
import select
import selectors
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

Handler = Callable[[int], None]
ErrorHandler = Callable[[BaseException], None]
Poke = Callable[[], None]
GRACE = 2e-3  # how long after an application thread last led the engine thread stays parked
STAGING = 1 << 16  # the staging buffer the connections read small frames into (see Connection._stage)
READ, WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE  # the masks handlers see, as with selectors
_NOT_IN, _NOT_OUT = ~select.EPOLLIN, ~select.EPOLLOUT  # epoll flags that mean "writable", "readable"
_due = operator.itemgetter(0)  # a timer's deadline


class Engine:
    def __init__(self, name: str) -> None:
        self.lock = threading.RLock()
        self.grace = GRACE  # per engine, so that a test can stretch it without touching other contexts
        self.failures: list[BaseException] = []
        # epoll itself, not selectors: the wrapper costs a few microseconds per wait, and a leg makes several
        self._epoll = select.epoll()
        self._handlers: dict[int, tuple[Handler, int]] = {}  # fd -> handler, the events it watches
        self._bulk: set[int] = set()  # sockets in the middle of a bulk transfer (see bulk())
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._epoll.register(self._wake_fd, select.EPOLLIN)
        self._timers: dict[object, tuple[float, Callable[[], None], ErrorHandler | None]] = {}
        self._first_due = math.inf  # no timer is due before this
        self._sleep_until = 0.0  # when the current wait of the thread that fires the timers ends by itself
        self._errors: dict[int, ErrorHandler] = {}
        self.staging = memoryview(bytearray(STAGING))
        self.staging_user: object = None  # the connection reading into `staging` now
        self._stopping = self._closed = False
        self._lead = threading.Lock()
        self._leader = 0  # the ident of the thread holding the lead, 0 for none
        self._app_led = -math.inf  # when an application thread last held (or asked for) the lead
        self._lead_since = 0.0  # when the current leader took the lead
        self._unpark = threading.Event()
        self._followers: set[Poke] = set()
        self._thread = threading.Thread(target=self._run, name=f"shift-tcp-{name}", daemon=True)
        self._ident = 0  # the engine thread's, set when it runs
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def watch(
        self, fd: int, events: int, handler: Handler, on_error: Callable[[BaseException], None]
    ) -> None:
        """Call handler(mask) when fd is ready for `events` (READ, WRITE: register or change); caller holds
        the lock."""
        self._errors[fd] = on_error
        flags = (select.EPOLLIN if events & READ else 0) | (select.EPOLLOUT if events & WRITE else 0)
        try:
            self._epoll.modify(fd, flags)
        except FileNotFoundError:
            self._epoll.register(fd, flags)
        self._handlers[fd] = (handler, events)

    def unwatch(self, fd: int) -> None:
        self._errors.pop(fd, None)
        self._bulk.discard(fd)
        if self._handlers.pop(fd, None) is not None:
            with contextlib.suppress(OSError, ValueError):
                self._epoll.unregister(fd)

    def set_timer(
        self,
        owner: object,
        deadline: float | None,
        callback: Callable[[], None],
        on_error: ErrorHandler | None = None,
    ) -> None:
        """Arm (or with None, cancel) the one timer of `owner`; callback runs with the lock held.

        A thread waiting in epoll is woken only when the new deadline comes before the end of its wait: a
        wake-up costs a thread switch and a fight for the interpreter lock, which shows in every round trip.
        The parked engine thread is not woken at all: the application's own passes fire the timers that fall
        due while it calls in, and the engine thread is back within GRACE of its last call.
        """
        if deadline is None:
            gone = self._timers.pop(owner, None)
            if gone is not None and gone[0] <= self._first_due:
                self._first_due = min(map(_due, self._timers.values()), default=math.inf)
            return
        self._timers[owner] = (deadline, callback, on_error)
        self._first_due = min(self._first_due, deadline)
        if deadline < self._sleep_until and self._leader not in (0, threading.get_ident()):
            self.wake()

    def bulk(self, fd: int, busy: bool) -> None:
        """Note whether fd is in the middle of a bulk transfer (output waiting for room in the socket, or a
        large payload arriving). The engine's thread then stays at the sockets instead of parking: a stream
        moves faster with it reading and writing while the application posts than with hand-overs."""
        if not busy:
            self._bulk.discard(fd)
        elif fd not in self._bulk:
            self._bulk.add(fd)
            if not self._leader:
                self._unpark.set()

    def leads_here(self) -> bool:
        """Whether the calling thread holds the lead (it is dispatching, or about to wait in epoll)."""
        return self._leader == threading.get_ident()

    def wake(self) -> None:
        """Cut short the wait of the thread that acts next: the leader in epoll, else the parked engine."""
        if self._closed:
            return
        os.eventfd_write(self._wake_fd, 1)
        if not self._leader:
            self._unpark.set()

    def follow(self, poke: Poke) -> None:
        """Have poke() called whenever the lead is released, so a thread that found it taken tries again."""
        self._followers.add(poke)

    def unfollow(self, poke: Poke) -> None:
        self._followers.discard(poke)

    def turn(self, limit: float | None = None, poke: Poke | None = None) -> bool:
        """Lead once: wait in epoll for at most `limit` s (or until the first timer), then dispatch what came.

        False at once when another thread leads now (or the engine is stopping); if that is the engine's
        thread, it is told to step aside, unless a bulk transfer is under way (see bulk()). `poke` is the
        caller's own follow() callback, not called on release.
        """
        me = threading.get_ident()
        app = me != self._ident
        if self._stopping or not self._lead.acquire(blocking=False):
            if app and not self._stopping and not self._bulk:
                self._app_led = time.monotonic()
                if self._leader == self._ident:
                    self.wake()
            return False
        self._leader = me
        self._lead_since = time.monotonic()
        try:
            with self.lock:
                timeout = self._wait_for(limit)
            events = self._epoll.poll(timeout)
            with self.lock:
                if not self._stopping:
                    self._dispatch(events)
        except (OSError, ValueError):
            if not self._stopping:
                raise
        finally:
            self._leader = 0
            self._sleep_until = 0.0  # nobody waits: a timer set now fires <= GRACE late
            if app:
                self._app_led = time.monotonic()
                if self._bulk or self._app_led - self._lead_since > self.grace:
                    self._unpark.set()  # the engine thread may sleep until told (see _aside)
            self._lead.release()
            if len(self._followers) > (poke is not None) and (app or self._steps_aside()):
                for other in list(self._followers):
                    if other is not poke:
                        other()
        return True

    def _steps_aside(self) -> bool:
        """Whether the engine thread, having led, now parks (so a waiting application thread should lead)."""
        aside = self._aside()
        return aside is None or aside > 0

    def poll_once(self) -> None:
        """One non-blocking pass on the caller's thread, unless another thread is dispatching now.

        An application that busy-polls its CQ thereby moves its own data, and it counts as leading: the engine
        thread steps aside for GRACE, instead of racing the poller to every frame from epoll (a hand-over of
        the interpreter lock per message). Events seen here may be seen again by the leader; every handler
        finds nothing to do the second time.
        """
        if self._stopping:
            return
        self._app_led = time.monotonic()
        if self._leader == self._ident:
            self.wake()
        if not self.lock.acquire(blocking=False):
            return
        try:
            self._dispatch(self._epoll.poll(0))
        finally:
            self.lock.release()

    def stop(self) -> None:
        self._stopping = True
        self.wake()
        self._unpark.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
        self._lead.acquire(timeout=5)  # let a leader in epoll (woken above) leave it before it closes
        self._closed = True
        self._epoll.close()
        os.close(self._wake_fd)

    # -- the engine's own thread --------------------------------------------------------------------------

    def _run(self) -> None:
        self._ident = threading.get_ident()
        while not self._stopping:
            self._unpark.clear()  # before looking: a wake-up from now on is not lost
            aside = self._aside()
            if aside is None or aside > 0:
                # Park while the application drives progress: its own passes (poll_once, turn) read the
                # sockets and fire the timers that fall due meanwhile, so this thread keeps off the lock and
                # the interpreter lock until the application has been away for GRACE; then it leads.
                self._unpark.wait(aside)
            else:
                self.turn()

    def _aside(self) -> float | None:
        """How long the engine thread should keep off epoll (None: until woken), because an application
        thread leads or just led. A leader that has waited longer than GRACE, or leaves a bulk transfer under
        way, wakes it when leaving; a short lead (the usual round trip) does not, so this thread checks back
        GRACE after one began. A bulk transfer with nobody leading is never left to the application."""
        now = time.monotonic()
        if self._leader not in (0, self._ident):
            rest = self._lead_since + self.grace - now
            return rest if rest > 0 else None
        if self._bulk:
            return 0.0
        return self._app_led + self.grace - now

    # -- dispatch, on whichever thread leads --------------------------------------------------------------

    def _wait_for(self, limit: float | None) -> float:
        """Seconds until the first timer or the end of `limit`, whichever is first (-1: no end, as epoll
        has it); noted as the end of the caller's wait, so that set_timer knows whether to wake it."""
        now = time.monotonic()
        end = self._first_due if limit is None else min(self._first_due, now + limit)
        self._sleep_until = end
        return -1 if end == math.inf else max(0.0, end - now)

    def _dispatch(self, events: list[tuple[int, int]]) -> None:
        handlers = self._handlers
        for fd, flags in events:
            watched = handlers.get(fd)
            if watched is not None:
                mask = (WRITE if flags & _NOT_IN else 0) | (READ if flags & _NOT_OUT else 0)
                try:
                    watched[0](mask & watched[1])
                except Exception as exc:
                    self._fail(self._errors.get(fd), exc)
            elif fd == self._wake_fd and self._leader == threading.get_ident():
                # Only the leader drains it: the wake-up is for its wait in epoll, and a poll_once pass
                # that drained it first would leave the leader asleep (until its timeout, or for ever).
                self._drain_wake()
        if self._first_due <= time.monotonic():
            self._fire_timers()

    def _drain_wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self._wake_fd)

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
        self._first_due = min(map(_due, self._timers.values()), default=math.inf)

    def _fail(self, on_error: ErrorHandler | None, exc: BaseException) -> None:
        log.exception("tcp provider: handler failed", exc_info=exc)
        self.failures.append(exc)
        if on_error is not None:
            try:
                on_error(exc)
            except Exception as again:
                self.failures.append(again)
