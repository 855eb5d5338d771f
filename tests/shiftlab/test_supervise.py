"""shiftlab.supervise as shiftd.socket: --listen holds one socket for every child it starts, and SIGUSR1
restarts the child (`systemctl restart`) while callers wait in the socket's backlog."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from waiting import wait_until

# A daemon in miniature: takes the passed socket, says READY=1, answers each caller it accepted with its
# PID and what it was passed, and stops cleanly on SIGTERM (between callers, never in the middle of one).
CHILD = """
import json, os, signal, socket
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
listener = socket.socket(fileno=3)
listener.settimeout(0.05)
passed = {k: os.environ.get(k) for k in ("LISTEN_PID", "LISTEN_FDS")}
notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
notify.sendto(b"READY=1", "\\0" + os.environ["NOTIFY_SOCKET"][1:])
while not stop:
    try:
        conn, _ = listener.accept()
    except TimeoutError:
        continue
    conn.sendall(json.dumps({"pid": os.getpid(), **passed}).encode())
    conn.close()
"""


def ask(path: Path) -> dict:
    """Connect and read the child's answer (waiting, as a caller does while no child serves)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(path))
        return json.loads(sock.recv(4096))


@pytest.fixture
def supervised(tmp_path):
    """The supervisor holding tmp/s.sock for CHILD; its state file; stopped (SIGTERM) after."""
    path, state = tmp_path / "s.sock", tmp_path / "state.json"
    argv = [sys.executable, "-m", "shiftlab.supervise", "--state", str(state), "--listen", str(path)]
    proc = subprocess.Popen([*argv, "--", sys.executable, "-c", CHILD])

    def read() -> dict:
        return json.loads(state.read_text()) if state.exists() else {}

    assert wait_until(lambda: read().get("ready"), timeout=30)
    yield proc, path, read
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def test_the_child_gets_the_held_socket_as_socket_activation_passes_it(supervised):
    _, path, read = supervised
    answer = ask(path)
    assert answer == {"pid": read()["pid"], "LISTEN_PID": str(read()["pid"]), "LISTEN_FDS": "1"}
    assert path.stat().st_mode & 0o777 == 0o600  # until the daemon gives it its mode and group


def test_sigusr1_restarts_the_child_and_callers_wait_meanwhile(supervised):
    proc, path, read = supervised
    first = read()["pid"]
    os.kill(proc.pid, signal.SIGUSR1)  # the supervisor this test started
    answer = ask(path)  # sent at once: waits in the backlog if no child serves yet
    assert wait_until(lambda: read().get("restarts") == 1 and read().get("ready"), timeout=30)
    second = read()["pid"]
    assert second != first and answer["pid"] in (first, second)
    assert read()["last_exit"] == "exited with status 0"  # a clean stop, and a new process anyway
    assert ask(path)["pid"] == second and ask(path)["LISTEN_PID"] == str(second)


def test_the_socket_goes_with_the_supervisor(supervised):
    proc, path, _ = supervised
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert not path.exists()
