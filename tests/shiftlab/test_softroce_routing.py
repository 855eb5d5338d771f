"""The rxe lab's routing (shiftlab.softroce, shiftlab.routekeeper) on any kernel, rxe devices aside.

This host's own namespace must not be touched and its kernel has no rdma_rxe, so a fresh namespace stands in
for the initial one: the NICs of two hosts live there, cabled to rail namespaces, as `shift-lab up --provider
rxe` lays them out. Each NIC must reach the other host's NIC on its rail through the rail's cable (not on lo,
though both addresses are local), a NIC taken down and up gets its table back from the route keeper, and
`destroy` leaves rules, routes and rp_filter as they were. tests/shiftlab/test_lab_rxe.py runs the whole lab,
rxe devices included, where rdma_rxe loads.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from pyroute2 import IPRoute

from shiftlab import fabric, netns, routekeeper, softroce
from shiftlab.fabric import Shape

pytestmark = [pytest.mark.lab, pytest.mark.timeout(120)]

T = TypeVar("T")


@pytest.fixture
def stand_in() -> Iterator[str]:
    """A namespace standing in for the initial one, its all.rp_filter strict as some distributions set it."""
    name = f"sri{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
    netns.run(name, softroce.RP_FILTER_ALL.write_text, "1")
    try:
        yield name
    finally:
        fabric.destroy(f"sr{os.getpid()}")
        subprocess.run(["ip", "netns", "del", name], check=True)


def machine(ns: str) -> tuple[str, str, str]:
    ip = ["ip", "-n", ns]
    rules = subprocess.run([*ip, "rule"], capture_output=True, text=True, check=True).stdout
    routes = subprocess.run([*ip, "route", "show", "table", "all"], capture_output=True, text=True).stdout
    return rules, routes, netns.run(ns, softroce.RP_FILTER_ALL.read_text)


def rx_packets(ns: str, ifname: str) -> int:
    with IPRoute(netns=ns, flags=0) as ipr:
        return ipr.get_links(ifname=ifname)[0].get("IFLA_STATS64")["rx_packets"]


def route_from(ns: str, source: str, destination: str) -> str | None:
    """How a packet from `source` to `destination` would leave (`ip route get`); None: it would not."""
    argv = ["ip", "-n", ns, "route", "get", destination, "from", source]
    result = subprocess.run(argv, capture_output=True, text=True)
    return result.stdout.split("\n")[0] if result.returncode == 0 else None


def test_each_nic_reaches_its_rail_peer_through_the_cable(stand_in: str, tmp_path: Path) -> None:
    shape = Shape(f"sr{os.getpid()}", hosts=2, nics=2, provider="rxe")
    record = tmp_path / "softroce.json"
    before = machine(stand_in)

    def inside(fn: Callable[..., T], *args: object) -> T:
        return netns.run(stand_in, fn, *args)

    inside(fabric.build, shape)
    inside(softroce.route, shape, record)
    inside(softroce.route, shape, record)  # a second `up` of the same lab adds nothing
    assert len(inside(softroce._rules)) == shape.hosts * shape.nics
    assert inside(softroce.RP_FILTER_ALL.read_text).strip() == "0"
    for i, j in ((0, 1), (1, 0)):
        for r in range(shape.nics):
            port = shape.rail_ns(r)
            seen = rx_packets(port, f"h{j}")
            assert fabric.ping(stand_in, shape.rail_address(r, j), device=shape.nic_netdev(i, r), timeout=2)
            assert rx_packets(port, f"h{j}") > seen  # the echo reply left h{j} on the rail, not lo
    assert not fabric.ping(stand_in, shape.rail_address(1, 1), device=shape.nic_netdev(0, 0), timeout=0.5)

    nic = shape.nic_netdev(0, 0)
    subprocess.run(["ip", "-n", stand_in, "link", "set", nic, "down"], check=True)
    assert route_from(stand_in, shape.rail_address(0, 0), shape.rail_address(0, 1)) is None  # not on lo
    with IPRoute(netns=stand_in, flags=0) as ipr:
        assert routekeeper.missing(shape, ipr) == []  # down: nothing to put back yet
        subprocess.run(["ip", "-n", stand_in, "link", "set", nic, "up"], check=True)
        assert routekeeper.missing(shape, ipr) == [(0, 0)]  # the table went with the link
        keeper_argv = [sys.executable, "-m", "shiftlab.routekeeper", shape.name, "2", "2", "rxe"]
        keeper = subprocess.Popen(
            netns.command(stand_in, keeper_argv),
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert keeper.stdout is not None
            assert keeper.stdout.readline() == f"restored the routes of {nic}\n"
            assert routekeeper.missing(shape, ipr) == []
            subprocess.run(["ip", "-n", stand_in, "link", "set", nic, "down"], check=True)
            subprocess.run(["ip", "-n", stand_in, "link", "set", nic, "up"], check=True)
            assert keeper.stdout.readline() == f"restored the routes of {nic}\n"  # on the link event
        finally:
            keeper.terminate()
            keeper.wait(timeout=10)
    assert fabric.ping(stand_in, shape.rail_address(0, 1), device=nic, timeout=2)

    done = inside(softroce.destroy, record)
    assert done == [
        "removed 4 policy routing rules",
        "flushed 4 routing tables",
        "moved the local table's rule back to pref 0",
        "set net.ipv4.conf.all.rp_filter back to 1",
    ]
    assert not record.exists()
    fabric.destroy(shape.name)  # the NICs go with their rail peers
    assert machine(stand_in) == before
