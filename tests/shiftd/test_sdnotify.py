"""sd_notify over a real datagram socket, as systemd listens for it."""

import socket

from shiftd.sdnotify import Notifier


def test_ready_and_watchdog_reach_the_socket(tmp_path):
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(str(path))
        notifier = Notifier({"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "2000000"})
        assert notifier.enabled
        assert notifier.watchdog_interval == 1.0
        notifier.ready("serving")
        notifier.watchdog()
        notifier.stopping()
        listener.settimeout(2)
        messages = [listener.recv(4096).decode() for _ in range(3)]
    assert "READY=1" in messages[0].split("\n")
    assert "STATUS=serving" in messages[0].split("\n")
    assert messages[1] == "WATCHDOG=1"
    assert messages[2] == "STOPPING=1"


def test_abstract_socket_address():
    name = f"shift-test-{id(object())}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind("\0" + name)
        Notifier({"NOTIFY_SOCKET": "@" + name}).ready()
        listener.settimeout(2)
        assert "READY=1" in listener.recv(4096).decode()


def test_no_socket_means_no_op():
    notifier = Notifier({})
    assert not notifier.enabled
    assert notifier.watchdog_interval is None
    notifier.ready()  # must not raise


def test_watchdog_for_another_pid_is_ignored():
    assert (
        Notifier({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "1000", "WATCHDOG_PID": "1"}).watchdog_interval
        is None
    )
