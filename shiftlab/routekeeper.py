"""The route keeper of a lab on rxe (`python -m shiftlab.routekeeper NAME HOSTS NICS`), run by `shift-lab up`.

Taking a NIC down (`shiftctl fail-nic`) flushes its route (its table keeps only its blackhole) and
permanent neighbours (shiftlab/softroce.py); the kernel puts back only the routes of its addresses. So on
every link event this process looks for a NIC that is up without its route and puts the route and the
neighbours back, as the NIC's own configuration would on a real host. It waits on netlink, so it costs
nothing while links stay as they are (in a VM under TCG a poll would not be free). It runs until `shift-lab
down` stops it.
"""

from __future__ import annotations

import select
import socket
import sys

from pyroute2 import IPRoute
from pyroute2.netlink.rtnl import RTMGRP_LINK

from shiftlab import softroce
from shiftlab.fabric import Shape

RECHECK = 5.0  # seconds between looks without a link event, should one have been missed
IFF_UP = 0x1


def missing(shape: Shape, ipr: IPRoute) -> list[tuple[int, int]]:
    """The NICs (host, rail) that are up but whose table has no route through them (only its blackhole)."""
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


def keep(shape: Shape) -> None:
    with IPRoute() as ipr, IPRoute() as events:
        events.bind(groups=RTMGRP_LINK)
        while True:
            if nics := missing(shape, ipr):
                softroce.batch("ip", softroce.repair_commands(shape, nics), check=False)
                print(
                    f"restored the routes of {', '.join(shape.nic_netdev(i, r) for i, r in nics)}", flush=True
                )
            if select.select([events], [], [], RECHECK)[0]:
                events.get()  # drain: what changed is looked up afresh


def main(argv: list[str]) -> int:
    name, hosts, nics = argv
    keep(Shape(name, int(hosts), int(nics), provider="rxe"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
