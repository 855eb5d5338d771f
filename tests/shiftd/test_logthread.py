"""shiftd logs through a writer thread: a sink that does not read never holds up the caller, and what a
full queue turned away is counted in the log once the sink reads again."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator

import pytest

from shiftd import logthread

FORMAT = "%(levelname)s %(message)s"


@pytest.fixture
def root_handlers() -> Iterator[None]:
    """The root logger as it was, after the test (log_off_the_loop configures it)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in root.handlers[:]:
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


def read_all(fd: int, into: list[bytes]) -> None:
    while chunk := os.read(fd, 65536):
        into.append(chunk)


def test_lines_reach_the_stream_in_order(root_handlers, monkeypatch) -> None:
    read_fd, write_fd = os.pipe()
    stream = os.fdopen(write_fd, "w")
    writer = logthread.log_off_the_loop("INFO", FORMAT, stream)
    got: list[bytes] = []
    reader = threading.Thread(target=read_all, args=(read_fd, got))
    reader.start()
    log = logging.getLogger("shiftd.test")
    for i in range(100):
        log.info("line %d", i)
    log.debug("not at INFO")
    writer.stop()
    stream.close()
    reader.join(5)
    os.close(read_fd)
    lines = b"".join(got).decode().splitlines()
    assert lines == [f"INFO line {i}" for i in range(100)]


def test_a_sink_that_does_not_read_never_holds_up_the_caller(root_handlers, monkeypatch) -> None:
    monkeypatch.setattr(logthread, "QUEUE_RECORDS", 50)
    read_fd, write_fd = os.pipe()
    stream = os.fdopen(write_fd, "w")
    writer = logthread.log_off_the_loop("INFO", FORMAT, stream)
    log = logging.getLogger("shiftd.test")
    line = "x" * 1000
    started = time.monotonic()
    for i in range(500):  # 500 kB: the pipe (64 KiB) is full after ~65 lines, the queue after 50 more
        log.warning("%d %s", i, line)
    assert time.monotonic() - started < 2.0  # a blocked write would hold the caller for good
    got: list[bytes] = []
    reader = threading.Thread(target=read_all, args=(read_fd, got))
    reader.start()
    writer.stop()
    stream.close()
    reader.join(5)
    os.close(read_fd)
    lines = b"".join(got).decode().splitlines()
    # the lines kept are whole and in order; in each gap, the count of the lines dropped there
    expected, gaps = 0, 0
    for ln in lines:
        first, second = ln.split()[1:3]
        if second == "log":
            assert ln == f"WARNING {first} log records dropped: the log's reader fell behind"
            expected += int(first)
            gaps += 1
        else:
            assert ln == f"WARNING {expected} {line}"
            expected += 1
    assert expected == 500 and gaps >= 1
