"""shiftlab.labproc on a real lab host: a tiny JSON-lines program in the namespace of a 1-host lab ("jl")."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from labs import running_lab

from shiftlab.lab import Lab
from shiftlab.labproc import LabProcess, LabProcessError

pytestmark = [pytest.mark.lab, pytest.mark.timeout(120)]

# Orders, one JSON line each: {"echo": x} (a line without "echo" first), {"stderr": n} (n bytes to stderr),
# {"raw": text} (a line as is), {"exit": code}; {} is heard and not answered. At the end of stdin: exit 0.
PROGRAM = r"""
import json, os, sys
def say(**fields): print(json.dumps(fields), flush=True)
say(started=True, pid=os.getpid(), netdevs=sorted(os.listdir("/sys/class/net")),
    socket=os.environ.get("SHIFT_SOCKET"))
for line in sys.stdin:
    order = json.loads(line)
    if "echo" in order:
        say(state="busy")
        say(echo=order["echo"])
    elif "stderr" in order:
        sys.stderr.write("x" * order["stderr"] + "\nend of noise\n")
        sys.stderr.flush()
        say(wrote=order["stderr"])
    elif "raw" in order:
        print(order["raw"], flush=True)
    elif "exit" in order:
        print("leaving on request", file=sys.stderr, flush=True)
        sys.exit(order["exit"])
"""


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with running_lab("jl", hosts=1, nics=1) as lab:
        yield lab


@pytest.fixture
def program(lab: Lab) -> Iterator[LabProcess]:
    proc = LabProcess(lab, "h0", [sys.executable, "-c", PROGRAM], timeout=30.0)
    try:
        yield proc
    finally:
        proc.end(grace=0)


def test_runs_inside_the_host_and_talks_json_lines(lab: Lab, program: LabProcess) -> None:
    started = program.read("started")
    assert started["pid"] == program.pid  # `ip netns exec` execs: the PID is the program's
    assert lab.shape.devices()["mlx5_0"] in started["netdevs"]  # the host's NIC: its namespace
    assert started["socket"] == str(lab.socket("h0"))
    assert program.ask("echo", echo=[1, "two"]) == {"echo": [1, "two"]}  # {"state"} skipped
    assert program.end() == 0  # stdin closed: it leaves on its own
    assert program.end() == 0  # idempotent


def test_stderr_is_kept_and_a_chatty_program_never_blocks(program: LabProcess) -> None:
    # 1 MiB is 16 pipes' worth: with stderr on an unread pipe the program would block before answering
    assert program.ask("wrote", stderr=1 << 20) == {"wrote": 1 << 20}
    assert program.stderr().endswith("x\nend of noise\n")
    assert len(program.stderr()) == 6000  # the tail only
    program.send(exit=0)
    assert program.end() == 0
    assert program.stderr().endswith("end of noise\nleaving on request\n")  # still there once ended


def test_stderr_file_is_kept_after_the_end(lab: Lab, tmp_path: Path) -> None:
    log = tmp_path / "program.log"
    proc = LabProcess(lab, "h0", [sys.executable, "-c", PROGRAM], stderr_file=log)
    proc.ask("wrote", stderr=10)
    proc.send(exit=4)
    assert proc.end() == 4
    assert log.read_text() == "x" * 10 + "\nend of noise\nleaving on request\n"


def test_timeout_ends_the_program_and_shows_its_stderr(program: LabProcess) -> None:
    program.ask("wrote", stderr=3)
    program.send()  # heard, never answered
    with pytest.raises(LabProcessError) as caught:
        program.read("never", timeout=0.5)
    assert str(caught.value) == "h0: no 'never' within 0.5s; stderr:\nxxx\nend of noise\n"
    assert program.end() == -9  # killed by the read that gave up


def test_end_before_the_key_is_an_error_at_once(program: LabProcess) -> None:
    program.read("started")
    program.send(exit=2)
    began = time.monotonic()
    with pytest.raises(LabProcessError) as caught:
        program.read("echo", timeout=60)
    assert time.monotonic() - began < 30  # at the end of its stdout, not at the timeout
    assert str(caught.value) == "h0: ended (exit 2) before saying 'echo'; stderr:\nleaving on request\n"
    with pytest.raises(LabProcessError, match="ended"):  # and every later read says so too
        program.read("echo")
    program.send(echo=1)  # to a program that is gone: nowhere, no error


def test_a_line_that_is_not_json_is_an_error(program: LabProcess) -> None:
    program.send(raw="Traceback (most recent call last):")
    with pytest.raises(LabProcessError, match=r"^h0: not a JSON line: 'Traceback \(most recent"):
        program.read("echo")
    assert program.end() == -9


def test_send_writes_one_json_line_per_call(program: LabProcess) -> None:
    fields = {"echo": {"nested": [1, 2.5, None]}, "other": "ignored"}
    assert program.ask("echo", **fields)["echo"] == json.loads(json.dumps(fields["echo"]))
    assert program.ask("echo", echo="second")["echo"] == "second"
