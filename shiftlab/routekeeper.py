"""A lab's route keeper (`python -m shiftlab.routekeeper NAME HOSTS NICS PROVIDER`), run by `shift-lab up`.

Taking a NIC down (`shiftctl fail-nic`) flushes the routes through it, and the kernel puts back only the
routes of its addresses: on tcp the NIC's route to the other rails through the spine (shiftlab.spine), on
rxe its table's route and permanent neighbours (shiftlab.softroce). So on every link event this process
looks for a NIC that is up without them and puts them back, as the NIC's own configuration would on a real
host. It waits on netlink, so it costs nothing while links stay as they are (in a VM under TCG a poll would
not be free). It runs until `shift-lab down` stops it.
"""

from __future__ import annotations

import select
import socket
import sys
from contextlib import ExitStack

from pyroute2 import IPRoute
from pyroute2.netlink.rtnl import RTMGRP_LINK

from shiftlab import softroce, spine
from shiftlab.fabric import Shape

RECHECK = 5.0  # seconds between looks without a link event, should one have been missed
IFF_UP = 0x1


def missing(shape: Shape, ipr: IPRoute) -> list[tuple[int, int]]:
    """On rxe: the NICs (host, rail) that are up but whose table has no route through them (only its
    blackhole)."""
    up = {link.get("ifname"): link["index"] for link in ipr.get_links() if link["flags"] & IFF_UP}
    routed = {
        (route.get("table"), route.get_attr("RTA_OIF")) for route in ipr.route("dump", family=socket.AF_INET)
    }
    return [
        (i, r)
        for i in range(shape.hosts)
        for r in range(shape.nics)
        if (netdev := shape.nic_netdev(i, r)) in up and (softroce.table(i, r), up[netdev]) not in routed
    ]


def restore(shape: Shape, hosts: dict[int, IPRoute]) -> list[tuple[int, int]]:
    """Put back the routes of every NIC (host, rail) that is up without them; returns those NICs.
    `hosts`: host index -> a socket in its namespace (rxe: the initial namespace's, for every host)."""
    if shape.spine_ns is None:
        nics = missing(shape, next(iter(hosts.values())))
        softroce.batch("ip", softroce.repair_commands(shape, nics), check=False)
        return nics
    nics = []
    for i, ipr in hosts.items():
        for r in spine.missing(ipr, {r: shape.nic_netdev(i, r) for r in range(shape.nics)}):
            spine.route(ipr, r, shape.nic_netdev(i, r))
            nics.append((i, r))
    return nics


def keep(shape: Shape) -> None:
    namespaces = {0: None} if shape.in_initial_ns else {i: shape.host_ns(i) for i in range(shape.hosts)}
    with ExitStack() as stack:
        hosts = {i: stack.enter_context(_socket(ns)) for i, ns in namespaces.items()}
        events = [stack.enter_context(_socket(ns)) for ns in namespaces.values()]
        for sock in events:
            sock.bind(groups=RTMGRP_LINK)
        while True:
            if nics := restore(shape, hosts):
                names = ", ".join(_nic_name(shape, i, r) for i, r in nics)
                print(f"restored the routes of {names}", flush=True)
            for sock in select.select(events, [], [], RECHECK)[0]:
                sock.get()  # drain: what changed is looked up afresh


def _nic_name(shape: Shape, i: int, r: int) -> str:
    """NIC (i, r) for the log: rxe's netdevs name their host already."""
    netdev = shape.nic_netdev(i, r)
    return netdev if shape.in_initial_ns else f"{shape.host_names[i]}/{netdev}"


def _socket(ns: str | None) -> IPRoute:
    """A netlink socket in namespace `ns` (None: this process's)."""
    return IPRoute() if ns is None else IPRoute(netns=ns, flags=0)


def main(argv: list[str]) -> int:
    name, hosts, nics, provider = argv
    keep(Shape(name, int(hosts), int(nics), provider=provider))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
