"""Fault injection on a real veth pair between two namespaces.

The injector runs on an event loop inside namespace A, as it does inside shiftd; the effects are
observed from namespace B through netlink (carrier of the peer), ICMP (traffic), and for the gray
faults measured: the share of a UDP burst that arrives each way, and a TCP stream's rate each way.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from linkprobe import tcp_rate, udp_delivery
from nsutil import NetnsLoop, netns
from pyroute2 import IPRoute

from shiftd.fault_spec import Fault
from shiftd.faults import FaultError, FaultInjector
from shiftd.nic import FaultMode
from shiftlab import fabric

pytestmark = pytest.mark.lab

NIC, PEER = "ens1f0np0", "peer0"
ADDR_A, ADDR_B = "198.18.200.1", "198.18.200.2"
LOSS = 10.0  # percent: 2,000 datagrams then arrive as 90% +- 0.7% (one standard deviation)
RATE = 100_000_000  # bits per second; an unfaulted veth carries one Python TCP stream at gigabits


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
    pair.loop.call(pair.injector.apply(NIC, Fault(FaultMode.DOWN)))
    assert pair.injector.active(NIC) == FaultMode.DOWN
    assert pair.link(pair.a, NIC)[0] is False
    assert wait_for(lambda: not pair.peer_carrier())

    pair.loop.call(pair.injector.clear(NIC))
    assert pair.injector.active(NIC) == FaultMode.NONE
    assert wait_for(pair.peer_carrier)
    assert fabric.ping(pair.b, ADDR_A, timeout=2.0)


def test_blackhole_keeps_carrier_but_drops_both_directions(pair: Pair) -> None:
    assert fabric.ping(pair.b, ADDR_A, timeout=2.0)

    pair.loop.call(pair.injector.apply(NIC, Fault(FaultMode.BLACKHOLE)))
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
    pair.loop.call(pair.injector.apply(NIC, Fault(FaultMode.FLAP)))
    assert pair.injector.active(NIC) == FaultMode.FLAP
    assert count_carrier_changes(pair, seconds=1.2) >= 4

    pair.loop.call(pair.injector.clear(NIC))
    assert pair.link(pair.a, NIC)[0] is True
    assert wait_for(pair.peer_carrier)
    assert count_carrier_changes(pair, seconds=0.6) == 0


def test_flap_period_can_be_given_per_fault(pair: Pair) -> None:
    pair.loop.call(pair.injector.apply(NIC, Fault(FaultMode.FLAP, period=1.6)))
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
    pair.loop.call(pair.injector.apply(NIC, Fault(FaultMode.BLACKHOLE)))
    pair.loop.call(pair.injector.apply(NIC, Fault(FaultMode.DOWN)))
    assert pair.injector.active(NIC) == FaultMode.DOWN
    assert "clsact" not in pair.qdiscs()
    assert wait_for(lambda: not pair.peer_carrier())


def test_close_clears_every_fault(pair: Pair) -> None:
    pair.loop.call(pair.injector.apply(NIC, Fault(FaultMode.DOWN)))
    assert wait_for(lambda: not pair.peer_carrier())
    pair.loop.call(pair.injector.close())
    assert pair.injector.active(NIC) == FaultMode.NONE
    assert wait_for(pair.peer_carrier)


def test_clear_recovers_a_fault_this_injector_did_not_apply(pair: Pair) -> None:
    """A restarted shiftd has a fresh injector but must still recover a NIC it left down."""
    pair.loop.call(pair.injector.apply(NIC, Fault(FaultMode.BLACKHOLE)))
    fresh = pair.loop.call(_make_injector())
    pair.loop.call(fresh.clear(NIC))
    assert "clsact" not in pair.qdiscs()
    assert fabric.ping(pair.b, ADDR_A, timeout=2.0)


def test_unknown_netdev_is_a_clear_error(pair: Pair) -> None:
    with pytest.raises(FaultError, match="no network interface 'ens9f0np0'"):
        pair.loop.call(pair.injector.apply("ens9f0np0", Fault(FaultMode.DOWN)))
    with pytest.raises(FaultError, match="no network interface 'ens9f0np0'"):
        pair.loop.call(pair.injector.clear("ens9f0np0"))


def test_bad_flap_period_is_refused() -> None:
    with pytest.raises(FaultError, match="flap period must be greater than 0"):
        FaultInjector(flap_period=0)


def delivery(pair: Pair) -> tuple[float, float]:
    """The share of a UDP burst that arrives: into the faulted NIC (B to A), and out of it (A to B)."""
    return udp_delivery(pair.b, pair.a, ADDR_A), udp_delivery(pair.a, pair.b, ADDR_B)


def test_lossy_drops_its_share_both_ways_and_clear_ends_it(pair: Pair) -> None:
    assert min(delivery(pair)) >= 0.995  # a veth loses nothing by itself

    pair.loop.call(pair.injector.apply(NIC, Fault(FaultMode.LOSSY, loss_percent=LOSS)))
    assert pair.injector.active(NIC) == FaultMode.LOSSY
    assert pair.link(pair.a, NIC) == (True, True)
    inward, outward = delivery(pair)
    print(f"lossy {LOSS:g}%: {inward:.3f} of a burst arrives into the NIC, {outward:.3f} out of it")
    expected = 1 - LOSS / 100
    assert abs(inward - expected) < 0.03 and abs(outward - expected) < 0.03, (inward, outward)

    pair.loop.call(pair.injector.clear(NIC))
    assert "clsact" not in pair.qdiscs()
    assert min(delivery(pair)) >= 0.995


def test_slow_limits_what_the_nic_sends_and_clear_lifts_it(pair: Pair) -> None:
    unfaulted = tcp_rate(pair.a, pair.b, ADDR_B)
    assert unfaulted > 5 * RATE

    pair.loop.call(pair.injector.apply(NIC, Fault(FaultMode.SLOW, rate_bits=RATE)))
    assert pair.injector.active(NIC) == FaultMode.SLOW
    assert "tbf" in pair.qdiscs()
    out, into = tcp_rate(pair.a, pair.b, ADDR_B), tcp_rate(pair.b, pair.a, ADDR_A)
    mbit = [f"{rate / 1e6:.0f}" for rate in (out, unfaulted, into)]
    print("slow 100mbit: Mbit/s out of the NIC {} (unfaulted {}), into it {}".format(*mbit))
    assert 0.7 * RATE < out < 1.1 * RATE
    assert into > 5 * RATE  # tbf shapes what the NIC sends, not what it receives

    pair.loop.call(pair.injector.clear(NIC))
    assert "tbf" not in pair.qdiscs()
    assert tcp_rate(pair.a, pair.b, ADDR_B) > 5 * RATE


def test_a_gray_fault_replaces_another_and_close_clears_both_kinds(pair: Pair) -> None:
    pair.loop.call(pair.injector.apply(NIC, Fault(FaultMode.SLOW, rate_bits=RATE)))
    pair.loop.call(pair.injector.apply(NIC, Fault(FaultMode.LOSSY, loss_percent=LOSS)))
    assert "tbf" not in pair.qdiscs() and "clsact" in pair.qdiscs()
    pair.loop.call(pair.injector.apply(NIC, Fault(FaultMode.SLOW, rate_bits=RATE)))
    assert "tbf" in pair.qdiscs() and "clsact" not in pair.qdiscs()
    pair.loop.call(pair.injector.close())
    assert not {"tbf", "clsact"} & set(pair.qdiscs())
    assert pair.injector.active(NIC) == FaultMode.NONE


def test_clear_leaves_a_root_qdisc_that_is_not_its_own(pair: Pair) -> None:
    """Only the rate limit the injector marked (its handle) goes: an operator's own shaping stays."""
    argv = ["tc", "-n", pair.a, "qdisc", "add", "dev", NIC, "root", "handle", "7:", "tbf", "rate", "1gbit"]
    subprocess.run([*argv, "burst", "64kb", "latency", "50ms"], check=True)
    pair.loop.call(pair.injector.clear(NIC))
    assert "tbf" in pair.qdiscs()
