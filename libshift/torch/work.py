"""The group's collectives run one at a time on a thread of their own, each a torch `Work` with a future.

The caller gets its Work back at once, as with NCCL, so DDP's reducer goes on with the backward pass while a
bucket travels the ring; the single thread keeps the calls in the order they were made, which is what makes
every rank run the same sequence. A failure in the ring leaves it in an unknown state, so it breaks the
group: every later call fails at once, naming the call that broke it. A ValueError or TypeError is a
mistake in the call itself (caught before anything is sent) and fails only that call.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

USER_ERRORS = (ValueError, TypeError)


class ShiftWork(dist.Work):
    """One collective: `wait()` returns when it has run (re-raising its error), `get_future()` for hooks."""

    def __init__(self, call: str, result: object) -> None:
        super().__init__()
        self.call = call
        self._result = result  # what the future gives: the tensors written, as torch's backends do
        # held until the collective has run: a Lock, as an Event (a Condition) costs microseconds to make
        self._gate = threading.Lock()
        self._gate.acquire()
        self._finished = False
        self._error: BaseException | None = None
        # The future is made when asked for (DDP asks; a plain call never does, and two torch futures cost
        # tens of microseconds a call). It fails as C++ sees a failure: by a callback that raises.
        # Future.set_exception only stores the exception as the future's value, for Python to raise; DDP's
        # reducer reads the value in C++ as the tensors and crashed on it (SIGSEGV in
        # parseCppCommHookResult) when a collective failed.
        self._lock = threading.Lock()  # between finish() on the runner and get_future() on the caller
        self._ended: torch.futures.Future | None = None
        self._future: torch.futures.Future | None = None

    def _outcome(self, _: torch.futures.Future) -> object:
        if self._error is not None:
            raise self._error
        return self._result

    def finish(self, error: BaseException | None) -> None:
        self._error = error
        with self._lock:
            self._finished = True
            ended = self._ended
        self._gate.release()
        if ended is not None:
            ended.set_result(None)

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Block until the collective has run; no timeout (None or 0, torch's default) waits for good."""
        seconds = timeout.total_seconds() if timeout else 0.0
        if not self._finished:
            if not self._gate.acquire(timeout=seconds or -1):
                raise RuntimeError(f"shift backend: {self.call} did not complete within {seconds:g} s")
            self._gate.release()  # for any other waiter
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._finished

    def get_future(self) -> torch.futures.Future:
        with self._lock:
            made = self._future is None
            if made:
                self._ended = torch.futures.Future()
                self._future = self._ended.then(self._outcome)
            ended_already = made and self._finished
        if ended_already:
            self._ended.set_result(None)
        return self._future


class SerialRunner:
    """A thread that runs submitted collectives in order, until `close()`.

    A small call (`inline`) that finds nothing queued or running runs on the caller's thread instead: for a
    few KiB the two thread hand-offs cost as much as the collective (about 40 us each way on an idle core,
    more beside a busy one), and a caller with nothing in flight loses no overlap by waiting for it.
    """

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[tuple[ShiftWork, Callable[[], None]] | None] = queue.SimpleQueue()
        self._broken: str | None = None  # why the group can no longer run collectives
        self._guard = threading.Lock()  # over _pending
        self._pending = 0  # calls queued or running
        self._running = threading.Lock()  # held while a call runs, on whichever thread
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, call: str, result: object, run: Callable[[], None], inline: bool = False) -> ShiftWork:
        work = ShiftWork(call, result)
        with self._guard:
            # with nothing pending the runner holds no call, so the lock is free: the ring is this caller's
            now = inline and self._pending == 0 and self._running.acquire(blocking=False)
            self._pending += 1
            if not now:
                self._queue.put((work, run))
        if now:
            try:
                self._execute(work, run)
            finally:
                self._running.release()
                self._done()
        return work

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            with self._running:
                self._execute(*item)
            self._done()

    def _done(self) -> None:
        with self._guard:
            self._pending -= 1

    def _execute(self, work: ShiftWork, run: Callable[[], None]) -> None:
        if self._broken is not None:
            work.finish(RuntimeError(f"shift backend: {work.call}: {self._broken}"))
            return
        try:
            run()
        except USER_ERRORS as exc:
            work.finish(type(exc)(f"{work.call}: {exc}"))
        except Exception as exc:
            self._broken = f"the group is broken since {work.call} failed ({exc})"
            work.finish(exc)
        else:
            work.finish(None)

    def close(self) -> None:
        """Run what is queued, then stop the thread."""
        self._queue.put(None)
        self._thread.join()
