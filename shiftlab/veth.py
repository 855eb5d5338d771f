"""The smallest two-host fabric (`VethPair`): two network namespaces joined by one veth pair."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

from shiftlab.fabric import FabricError, wait_operational


def _run(*argv: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise FabricError(f"{' '.join(argv)}: {result.stderr.strip() or 'failed'}")


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
            for host in self.hosts:
                wait_operational(host.netns, host.netdev)
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
