"""Network namespaces: run code inside one (`entered`, `in_netns`), and build a two-host fabric (`VethPair`).

Linux keeps the network namespace per thread and a socket keeps the namespace it was created in, so creating
a Context's sockets inside `in_netns(...)` puts that device on another lab host while the rest of the process
stays where it was. Python 3.11 has no os.setns, hence ctypes.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from libshift.vocabulary.errors import VerbsError

CLONE_NEWNET = 0x40000000
NETNS_DIR = "/run/netns"
_libc = ctypes.CDLL(None, use_errno=True)


class NetnsError(RuntimeError):
    """A namespace is missing or cannot be entered; str() is one line for the operator."""


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise NetnsError(f"cannot enter network namespace: {os.strerror(err)}")


def _open(name: str) -> int:
    path = name if name.startswith("/") else os.path.join(NETNS_DIR, name)
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise NetnsError(f"network namespace {name!r} not found ({exc.strerror})") from None


@contextmanager
def _inside(target: int) -> Iterator[None]:
    """setns into the namespace open as `target` for the block, then back; closes `target`."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(target)
        os.close(own)


@contextmanager
def entered(name: str) -> Iterator[None]:
    """Move the calling thread into namespace `name` (a name in /run/netns, or a path) for the block."""
    with _inside(_open(name)):
        yield


@contextmanager
def in_netns(name: str | None) -> Iterator[None]:
    """Enter namespace `name` (None: stay) for the block; a verbs error if there is no such namespace."""
    if name is None:
        yield
        return
    try:
        target = _open(name)
    except NetnsError as exc:
        raise VerbsError(str(exc)) from None
    with _inside(target):
        yield


def _run(*argv: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise VerbsError(f"{' '.join(argv)}: {result.stderr.strip() or 'failed'}")


@dataclass(frozen=True)
class Host:
    netns: str
    netdev: str
    address: str


class VethPair:
    """Two network namespaces joined by one veth pair: the smallest two-host fabric, for tests and benches.

    Faults are real: `down(i)` sets host i's end down (the peer loses carrier), `blackhole(i)` keeps it up but
    drops everything it sends (tc), `restore(i)` undoes both. The lab fabric (shift-lab) is the full-size one.
    """

    def __init__(self, prefix: str, subnet: str = "198.18.91") -> None:
        self.hosts = tuple(Host(f"{prefix}-h{i}", f"{prefix}-nic{i}", f"{subnet}.{i + 1}") for i in range(2))

    def __enter__(self) -> VethPair:
        self.remove()
        try:
            for host in self.hosts:
                _run("ip", "netns", "add", host.netns)
                _run("ip", "-n", host.netns, "link", "set", "lo", "up")
            h0, h1 = self.hosts
            _run("ip", "link", "add", h0.netdev, "netns", h0.netns, "type", "veth", "peer", "name", h1.netdev,
                 "netns", h1.netns)  # fmt: skip
            for host in self.hosts:
                _run("ip", "-n", host.netns, "addr", "add", f"{host.address}/24", "dev", host.netdev)
                _run("ip", "-n", host.netns, "link", "set", host.netdev, "up")
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def remove(self) -> None:
        for host in self.hosts:
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True)

    def tcp_devices(self, *names: str) -> str:
        """A SHIFT_TCP_DEVICES value naming one device per host."""
        return ",".join(
            f"{name}={host.netdev}@{host.netns}" for name, host in zip(names, self.hosts, strict=True)
        )

    def down(self, index: int) -> None:
        host = self.hosts[index]
        _run("ip", "-n", host.netns, "link", "set", host.netdev, "down")

    def blackhole(self, index: int) -> None:
        host = self.hosts[index]
        _run("tc", "-n", host.netns, "qdisc", "replace", "dev", host.netdev, "root", "blackhole")

    def restore(self, index: int) -> None:
        host = self.hosts[index]
        subprocess.run(
            ["tc", "-n", host.netns, "qdisc", "del", "dev", host.netdev, "root"], capture_output=True
        )
        _run("ip", "-n", host.netns, "link", "set", host.netdev, "up")
