"""Fault injection on a real veth pair between two namespaces.

The injector runs on an event loop inside namespace A, as it does inside shiftd; the effects are
observed from namespace B through netlink (carrier of the peer) and ICMP (traffic).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from nsutil import NetnsLoop, netns
from pyroute2 import IPRoute

from shiftd.faults import FaultError, FaultInjector
from shiftd.nic import FaultMode
from shiftlab import fabric

pytestmark = pytest.mark.lab

NIC, PEER = "ens1f0np0", "peer0"
ADDR_A, ADDR_B = "198.18.200.1", "198.18.200.2"


@dataclass
class Pair:
    a: str
    b: str
    loop: NetnsLoop
    injector: FaultInjector

    def link(self, ns: str, ifname: str) -> tuple[bool, bool]:
        """(admin up, carrier) of a link, read through netlink inside `ns`."""
        with IPRoute(netns=ns, flags=0) as ipr:
            link = ipr.get_links(ifname=ifname)[0]
        return bool(link["flags"] & 1), bool(link.get("carrier"))

    def peer_carrier(self) -> bool:
        return self.link(self.b, PEER)[1]

    def qdiscs(self) -> list[str]:
        with IPRoute(netns=self.a, flags=0) as ipr:
            index = ipr.link_lookup(ifname=NIC)[0]
            return [q.get("kind") for q in ipr.get_qdiscs(index=index)]


def wait_for(predicate: Callable[[], bool], timeout: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


@pytest.fixture
def pair() -> Iterator[Pair]:
    with netns("lbfa") as a, netns("lbfb") as b:
        with IPRoute(netns=a, flags=0) as ipr:
            ipr.link("add", ifname=NIC, kind="veth", peer={"ifname": PEER, "net_ns_fd": b})
            index = ipr.link_lookup(ifname=NIC)[0]
            ipr.addr("add", index=index, address=ADDR_A, prefixlen=24)
            ipr.link("set", index=index, state="up")
        with IPRoute(netns=b, flags=0) as ipr:
            index = ipr.link_lookup(ifname=PEER)[0]
            ipr.addr("add", index=index, address=ADDR_B, prefixlen=24)
            ipr.link("set", index=index, state="up")
        with NetnsLoop(a) as loop:
            injector = loop.call(_make_injector())
            p = Pair(a, b, loop, injector)
            assert wait_for(p.peer_carrier)
            try:
                yield p
            finally:
                loop.call(injector.close())


async def _make_injector() -> FaultInjector:
    return FaultInjector(flap_period=0.2)


def test_down_drops_the_peers_carrier_and_clear_restores_it(pair: Pair) -> None:
    pair.loop.call(pair.injector.apply(NIC, FaultMode.DOWN))
    assert pair.injector.active(NIC) == FaultMode.DOWN
    assert pair.link(pair.a, NIC)[0] is False
    assert wait_for(lambda: not pair.peer_carrier())

    pair.loop.call(pair.injector.clear(NIC))
    assert pair.injector.active(NIC) == FaultMode.NONE
    assert wait_for(pair.peer_carrier)
    assert fabric.ping(pair.b, ADDR_A, timeout=2.0)


def test_blackhole_keeps_carrier_but_drops_both_directions(pair: Pair) -> None:
    assert fabric.ping(pair.b, ADDR_A, timeout=2.0)

    pair.loop.call(pair.injector.apply(NIC, FaultMode.BLACKHOLE))
    assert pair.injector.active(NIC) == FaultMode.BLACKHOLE
    assert pair.link(pair.a, NIC) == (True, True)
    assert pair.peer_carrier()
    assert "clsact" in pair.qdiscs()
    assert not fabric.ping(pair.b, ADDR_A, timeout=0.5)
    assert not fabric.ping(pair.a, ADDR_B, timeout=0.5)

    pair.loop.call(pair.injector.clear(NIC))
    assert "clsact" not in pair.qdiscs()
    assert fabric.ping(pair.b, ADDR_A, timeout=2.0)
    assert fabric.ping(pair.a, ADDR_B, timeout=2.0)


def test_flap_toggles_until_cleared(pair: Pair) -> None:
    pair.loop.call(pair.injector.apply(NIC, FaultMode.FLAP))
    assert pair.injector.active(NIC) == FaultMode.FLAP
    assert count_carrier_changes(pair, seconds=1.2) >= 4

    pair.loop.call(pair.injector.clear(NIC))
    assert pair.link(pair.a, NIC)[0] is True
    assert wait_for(pair.peer_carrier)
    assert count_carrier_changes(pair, seconds=0.6) == 0


def test_flap_period_can_be_given_per_fault(pair: Pair) -> None:
    pair.loop.call(pair.injector.apply(NIC, FaultMode.FLAP, period=1.6))
    # down for 0.8 s, then up: the injector's default 0.2 s rhythm would change twice in 0.5 s
    assert wait_for(lambda: not pair.peer_carrier())
    assert count_carrier_changes(pair, seconds=0.5) == 0
    assert wait_for(pair.peer_carrier, timeout=1.5)


def count_carrier_changes(pair: Pair, seconds: float) -> int:
    """Poll the peer's carrier through one netlink socket in B and count the changes."""
    changes = 0
    with IPRoute(netns=pair.b, flags=0) as ipr:
        index = ipr.link_lookup(ifname=PEER)[0]
        last = ipr.get_links(index)[0].get("carrier")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            carrier = ipr.get_links(index)[0].get("carrier")
            changes += carrier != last
            last = carrier
            time.sleep(0.01)
    return changes


def test_a_new_fault_replaces_the_old_one(pair: Pair) -> None:
    pair.loop.call(pair.injector.apply(NIC, FaultMode.BLACKHOLE))
    pair.loop.call(pair.injector.apply(NIC, FaultMode.DOWN))
    assert pair.injector.active(NIC) == FaultMode.DOWN
    assert "clsact" not in pair.qdiscs()
    assert wait_for(lambda: not pair.peer_carrier())


def test_close_clears_every_fault(pair: Pair) -> None:
    pair.loop.call(pair.injector.apply(NIC, FaultMode.DOWN))
    assert wait_for(lambda: not pair.peer_carrier())
    pair.loop.call(pair.injector.close())
    assert pair.injector.active(NIC) == FaultMode.NONE
    assert wait_for(pair.peer_carrier)


def test_clear_recovers_a_fault_this_injector_did_not_apply(pair: Pair) -> None:
    """A restarted shiftd has a fresh injector but must still recover a NIC it left down."""
    pair.loop.call(pair.injector.apply(NIC, FaultMode.BLACKHOLE))
    fresh = pair.loop.call(_make_injector())
    pair.loop.call(fresh.clear(NIC))
    assert "clsact" not in pair.qdiscs()
    assert fabric.ping(pair.b, ADDR_A, timeout=2.0)


def test_unknown_netdev_is_a_clear_error(pair: Pair) -> None:
    with pytest.raises(FaultError, match="no network interface 'ens9f0np0'"):
        pair.loop.call(pair.injector.apply("ens9f0np0", FaultMode.DOWN))
    with pytest.raises(FaultError, match="no network interface 'ens9f0np0'"):
        pair.loop.call(pair.injector.clear("ens9f0np0"))


def test_bad_flap_period_is_refused() -> None:
    with pytest.raises(FaultError, match="flap period must be greater than 0"):
        FaultInjector(flap_period=0)
