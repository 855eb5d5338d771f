"""shiftd.listenfds: the socket a holder (systemd's shiftd.socket, the lab's supervisor) passes to shiftd.

Each case runs in a child process, which has the socket at fd 3 as socket activation puts it (fd 3 of the
test process is someone else's) and is the LISTEN_PID the variables name."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = """
import json, os, sys
from shiftd.listenfds import ListenError, inherited_socket
os.dup2(int(sys.argv[1]), 3)
passed = json.loads(sys.argv[2])
os.environ.update({k: str(os.getpid()) if v == "me" else v for k, v in passed.items()})
try:
    sock = inherited_socket(sys.argv[3])
    result = {"bound": sock.getsockname() if sock else None, "inheritable": sock and sock.get_inheritable()}
except ListenError as exc:
    result = {"error": str(exc)}
result["left"] = sorted(k for k in os.environ if k.startswith("LISTEN_"))
print(json.dumps(result))
"""


def passed(sock: socket.socket, path: Path, **env: str) -> dict:
    """What inherited_socket(path) makes of `sock` at fd 3 with `env` ("me": the child's own PID)."""
    fd = sock.fileno()
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(fd), json.dumps(env), str(path)],
        pass_fds=[fd],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout)


@pytest.fixture
def path(tmp_path) -> Path:
    return tmp_path / "shiftd.sock"


@pytest.fixture
def listener(path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen()
    yield sock
    sock.close()


def test_the_socket_passed_to_this_process_is_taken_and_the_variables_go(listener, path):
    got = passed(listener, path, LISTEN_PID="me", LISTEN_FDS="1", LISTEN_FDNAMES="shiftd.socket")
    assert got == {"bound": str(path), "inheritable": False, "left": []}  # no child of shiftd takes it


def test_a_socket_passed_to_another_process_is_not_ours(listener, path):
    assert passed(listener, path, LISTEN_PID="1", LISTEN_FDS="1") == {
        "bound": None,
        "inheritable": None,
        "left": [],
    }
    assert passed(listener, path) == {"bound": None, "inheritable": None, "left": []}


def test_more_than_one_socket_is_refused(listener, path):
    assert "2 sockets passed" in passed(listener, path, LISTEN_PID="me", LISTEN_FDS="2")["error"]


def test_a_socket_on_another_path_is_refused(listener, path):
    error = passed(listener, path.with_name("other.sock"), LISTEN_PID="me", LISTEN_FDS="1")["error"]
    assert f"listens on '{path}'" in error


def test_a_datagram_socket_is_refused(path):
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        error = passed(sock, path, LISTEN_PID="me", LISTEN_FDS="1")["error"]
    assert "not a Unix stream socket" in error
