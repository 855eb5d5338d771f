"""The spine of a lab on tcp: the router where the rails meet.

In a rail-optimized cluster NIC r of every host plugs into leaf (rail) r, and the leaves meet at the spine,
so a NIC also reaches the NICs of other rails, a hop further: two ranks per host, each on its own NIC, talk
across rails (mlx5_1 of one host to mlx5_0 of another, or of the same host). The lab's spine is a namespace
with a leg on each rail switch, at 198.18.R.1, forwarding between them. Each host NIC routes the rails'
range through the spine's leg on its own rail, so a socket bound to a NIC still leaves through that NIC, as
an RDMA NIC's packets do; a rail's own subnet stays on the rail. A host accepts packets from its own
addresses (accept_local), so two of its NICs talk over the wire and the spine, as real NICs do, rather
than through the kernel's shortcut that device-bound sockets cannot take.

Setting a NIC down takes this route with it; the route keeper (shiftlab.routekeeper) puts it back when the
link comes up, as a host's network configuration would. The rxe lab (shiftlab.softroce) has no spine.
"""

from __future__ import annotations

import socket

from pyroute2 import IPRoute

RAILS, RAILS_PREFIXLEN = "198.18.0.0", 16  # every rail's subnet (198.18.R.0/24)
PORT = "spine"  # the spine's port on each rail switch
HOST_ID = 0xFF00  # stands for the spine in MAC addresses (shiftlab.fabric.nic_mac)
METRIC = 100  # + rail: below the kernel's own routes, one route per NIC
FORWARDING = {"net/ipv4/ip_forward": "1"}
IFF_UP = 0x1


def address(r: int) -> str:
    """The spine's address on rail r: each host's gateway to the other rails."""
    return f"198.18.{r}.1"


def leg(r: int) -> str:
    """The spine's netdev on rail r."""
    return f"rail{r}"


def route(host: IPRoute, r: int, netdev: str) -> None:
    """Host NIC `netdev` (on rail r) reaches the other rails through the spine (a route is replaced, so
    a second build adds nothing)."""
    index = host.link_lookup(ifname=netdev)[0]
    host.route(
        "replace",
        dst=RAILS,
        dst_len=RAILS_PREFIXLEN,
        gateway=address(r),
        oif=index,
        priority=METRIC + r,
    )


def missing(host: IPRoute, netdevs: dict[int, str]) -> list[int]:
    """The rails (of `netdevs`: rail -> netdev) whose NIC is up but has no route through the spine."""
    up = {link.get("ifname"): link["index"] for link in host.get_links() if link["flags"] & IFF_UP}
    routed = {
        route.get_attr("RTA_OIF")
        for route in host.route("dump", family=socket.AF_INET)
        if route.get_attr("RTA_GATEWAY") is not None
    }
    return [r for r, netdev in netdevs.items() if netdev in up and up[netdev] not in routed]
