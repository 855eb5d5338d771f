"""shiftd's log lines are written by a thread of their own; the event loop only queues them.

A write to stderr blocks while its reader does not read: journald behind, or a log file on a disk whose
filesystem journal is stalled (on this project's lab, whose logs are files on the root disk, both shiftds
fell silent for 20 s while the lab's etcd logged fdatasyncs of seconds). The loop that carries NIC events
to the agents must not wait for that. The queue is bounded so that a sink stalled
for good cannot take the host's memory: beyond it, records are dropped and counted, and the count is
written in their place once there is room again.
"""

from __future__ import annotations

import logging
import queue
import threading
from logging.handlers import QueueHandler
from typing import TextIO

QUEUE_RECORDS = 10_000  # ~minutes of a busy daemon's lines: a sink stalled longer loses the excess, counted
STOP_WAIT = 5.0  # at exit, how long the queued lines may take to be written
log = logging.getLogger("shiftd")


class DroppingQueueHandler(QueueHandler):
    """Queues records without ever waiting; counts those a full queue turned away."""

    def __init__(self, records: queue.Queue[logging.LogRecord | None]) -> None:
        super().__init__(records)
        self.dropped = 0

    def enqueue(self, record: logging.LogRecord) -> None:
        # called under the handler's lock: the count and its record go in order with the others
        try:
            if self.dropped:
                self.queue.put_nowait(self.owed())
                self.dropped = 0
            self.queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1

    def owed(self) -> logging.LogRecord:
        """The record that tells how many were dropped since the last one that went in."""
        record = log.makeRecord(
            log.name, logging.WARNING, __file__, 0,
            "%d log records dropped: the log's reader fell behind", (self.dropped,), None,
        )  # fmt: skip
        return self.prepare(record)


class LogWriter:
    """The thread that writes the queued records to the sink, in order."""

    def __init__(self, handler: DroppingQueueHandler, sink: logging.Handler) -> None:
        self._handler, self._sink = handler, sink
        self._records: queue.Queue[logging.LogRecord | None] = handler.queue
        self._thread = threading.Thread(target=self._run, name="shiftd-log", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (record := self._records.get()) is not None:
            self._sink.handle(record)

    def stop(self, wait: float = STOP_WAIT) -> None:
        """Write what is queued (and the count of what was dropped last) and end the thread; a sink stalled
        for longer than `wait` keeps the rest."""
        logging.getLogger().removeHandler(self._handler)
        try:
            if self._handler.dropped:
                self._records.put(self._handler.owed(), timeout=wait)
            self._records.put(None, timeout=wait)
        except queue.Full:
            return
        self._thread.join(wait)


def log_off_the_loop(level: str, fmt: str, stream: TextIO) -> LogWriter:
    """Configure the root logger to queue its records for a writer thread on `stream`, and start it."""
    handler = DroppingQueueHandler(queue.Queue(QUEUE_RECORDS))
    sink = logging.StreamHandler(stream)
    sink.setFormatter(logging.Formatter(fmt))
    root = logging.getLogger()
    root.setLevel(level)
    root.addHandler(handler)
    return LogWriter(handler, sink)
