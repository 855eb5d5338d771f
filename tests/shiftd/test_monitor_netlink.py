"""The netlink monitor against real veth pairs in a namespace of the test's own."""

from __future__ import annotations

import asyncio
import queue
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from socket import AF_BRIDGE

import pytest
from nsutil import NetnsLoop, ip, netns, open_sockets
from pyroute2.netlink import NLM_F_ACK, NLM_F_REQUEST
from pyroute2.netlink.rtnl import RTM_DELADDR, RTM_DELLINK, RTM_NEWLINK
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.ifinfmsg import IFF_LOWER_UP, IFF_UP, ifinfmsg

from shiftd.monitors.netlink import AddrMsg, LinkMsg, NetlinkMonitor, decode
from shiftd.nic import LinkStatus
from shiftlab.netns import run as netns_run

NIC, PEER = "mna0", "mnb0"  # inside the test's namespace only


@dataclass
class Watch:
    """A monitor running in the namespace, its reports in a queue with their arrival time."""

    task: asyncio.Task[None]
    reports: queue.Queue[tuple[float, LinkStatus]]

    def next(self, match: Callable[[LinkStatus], bool], timeout: float = 5.0) -> tuple[float, LinkStatus]:
        """The first report that matches, failing on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            arrived, link = self.reports.get(timeout=max(0.0, deadline - time.monotonic()))
            if match(link):
                return arrived, link

    def quiet(self, seconds: float = 0.2) -> list[LinkStatus]:
        """What arrives within `seconds`."""
        time.sleep(seconds)
        drained = []
        while not self.reports.empty():
            drained.append(self.reports.get_nowait()[1])
        return drained


class Lab:
    """A namespace with the veth pair NIC <-> PEER, up, and a loop running inside it."""

    def __init__(self, ns: str, loop: NetnsLoop) -> None:
        self.ns = ns
        self.loop = loop
        self.watches: list[Watch] = []

    def watch(self, netdevs: set[str] | None, **kwargs: int) -> Watch:
        reports: queue.Queue[tuple[float, LinkStatus]] = queue.Queue()
        monitor = NetlinkMonitor(netdevs, lambda link: reports.put((time.monotonic(), link)), **kwargs)
        watch = Watch(self.loop.call(_start(monitor)), reports)
        self.watches.append(watch)
        return watch

    def ip(self, *args: str) -> None:
        ip("-n", self.ns, *args)


async def _start(monitor: NetlinkMonitor) -> asyncio.Task[None]:
    return asyncio.create_task(monitor.run())


async def _cancel(task: asyncio.Task[None]) -> bool:
    """Cancel the monitor; True when it ended by the cancellation (not by an error)."""
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        return True
    return False


@pytest.fixture
def lab() -> Iterator[Lab]:
    with netns("mn") as ns, NetnsLoop(ns) as loop:
        lab = Lab(ns, loop)
        lab.ip("link", "add", NIC, "type", "veth", "peer", "name", PEER)
        lab.ip("addr", "add", "198.18.0.1/24", "dev", NIC)
        lab.ip("link", "set", NIC, "up")
        lab.ip("link", "set", PEER, "up")
        sockets = open_sockets()
        yield lab
        for watch in lab.watches:
            assert loop.call(_cancel(watch.task)), "the monitor did not end by cancellation"
        assert open_sockets() == sockets, "the monitor left its socket open"


def up(link: LinkStatus) -> bool:
    return link.usable


@pytest.mark.lab
def test_initial_dump_reports_watched_netdevs_with_addresses(lab: Lab) -> None:
    watch = lab.watch({NIC, "mnmissing"})
    _, first = watch.next(lambda link: link.netdev == NIC and link.usable)
    assert first == LinkStatus(
        NIC, True, admin_up=True, operstate="up", carrier=True, addresses=("198.18.0.1",)
    )
    _, missing = watch.next(lambda link: link.netdev == "mnmissing")
    assert missing == LinkStatus("mnmissing", present=False)
    assert all(link.netdev in (NIC, "mnmissing") for link in watch.quiet())  # the peer is not watched


@pytest.mark.lab
def test_peer_down_is_carrier_lost_and_fast(lab: Lab) -> None:
    watch = lab.watch({NIC})
    watch.next(up)
    assert watch.quiet() == []  # nothing changed, nothing reported
    sent = link_down(lab.ns, PEER)
    arrived, link = watch.next(lambda link: not link.carrier)
    assert (link.present, link.admin_up, link.operstate) == (True, True, "lowerlayerdown")
    latency = arrived - sent
    print(f"\nnetlink: link set down -> on_link callback: {latency * 1e6:.0f} us")
    assert latency < 0.25  # event-driven: typically well under a millisecond
    lab.ip("link", "set", PEER, "up")
    watch.next(up)


def link_down(ns: str, ifname: str) -> float:
    """Set a link down with one prepared rtnetlink message, sent from a thread in the namespace
    (not the monitor's loop, which must be idle and waiting); returns the monotonic time just
    before the send, so the measured latency is the kernel's event path plus the monitor's."""
    return netns_run(ns, _send_link_down, ifname)


def _send_link_down(ifname: str) -> float:
    request = ifinfmsg()
    request["index"] = socket.if_nametoindex(ifname)
    request["change"] = IFF_UP  # flags stay 0: clear IFF_UP
    request["header"]["type"] = RTM_NEWLINK
    request["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK
    request["header"]["sequence_number"] = 1
    request.encode()
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
        sock.bind((0, 0))
        sent = time.monotonic()
        sock.send(request.data)
        sock.recv(4096)  # the ack
    return sent


@pytest.mark.lab
def test_admin_down_and_up(lab: Lab) -> None:
    watch = lab.watch({NIC})
    watch.next(up)
    lab.ip("link", "set", NIC, "down")
    _, link = watch.next(lambda link: not link.admin_up)
    assert (link.present, link.carrier, link.operstate) == (True, False, "down")
    assert link.addresses == ("198.18.0.1",)  # IPv4 addresses survive admin down
    lab.ip("link", "set", NIC, "up")
    watch.next(up)


@pytest.mark.lab
def test_address_add_and_remove(lab: Lab) -> None:
    watch = lab.watch({NIC})
    watch.next(up)
    lab.ip("addr", "add", "198.18.1.1/24", "dev", NIC)
    _, added = watch.next(lambda link: len(link.addresses) == 2)
    assert added.addresses == ("198.18.0.1", "198.18.1.1")
    lab.ip("addr", "del", "198.18.0.1/24", "dev", NIC)
    _, removed = watch.next(lambda link: len(link.addresses) == 1)
    assert removed.addresses == ("198.18.1.1",)
    assert removed.usable


@pytest.mark.lab
def test_link_deleted_is_not_present_and_recreated_is_back(lab: Lab) -> None:
    watch = lab.watch({NIC})
    watch.next(up)
    lab.ip("link", "del", NIC)
    _, gone = watch.next(lambda link: not link.present)
    assert gone == LinkStatus(NIC, present=False)
    lab.ip("link", "add", NIC, "type", "veth", "peer", "name", PEER)
    _, back = watch.next(lambda link: link.present)
    assert (back.admin_up, back.addresses) == (False, ())


@pytest.mark.lab
def test_rename_reports_the_old_name_gone(lab: Lab) -> None:
    watch = lab.watch({NIC, "mnc0"})
    # both starting states, in either order: a veth's carrier can come up after the dump (linkwatch)
    starts = {NIC: up, "mnc0": lambda link: not link.present}
    while starts:
        _, link = watch.next(lambda link: link.netdev in starts and starts[link.netdev](link))
        del starts[link.netdev]
    lab.ip("link", "set", NIC, "down")
    lab.ip("link", "set", NIC, "name", "mnc0")
    reports = [watch.next(lambda link, name=name: link.netdev == name)[1] for name in (NIC, NIC, "mnc0")]
    assert reports[0].present and not reports[0].admin_up
    assert not reports[1].present
    assert reports[2].present and reports[2].addresses == ("198.18.0.1",)


@pytest.mark.lab
def test_bridge_port_messages_do_not_fake_a_carrier_loss(lab: Lab) -> None:
    watch = lab.watch({NIC})
    watch.next(up)
    lab.ip("link", "add", "mnbr0", "type", "bridge")
    lab.ip("link", "set", NIC, "master", "mnbr0")  # the kernel adds AF_BRIDGE RTM_NEWLINKs
    lab.ip("link", "set", NIC, "nomaster")  # ... and an AF_BRIDGE RTM_DELLINK
    assert all(link.usable for link in watch.quiet(0.3))


@pytest.mark.lab
def test_overflowed_socket_is_reopened_and_state_resynced(lab: Lab, caplog: pytest.LogCaptureFixture) -> None:
    watch = lab.watch({NIC}, rcvbuf=4096)
    watch.next(up)
    # stall the monitor's loop while the kernel queues more events than the socket holds
    lab.loop.loop.call_soon_threadsafe(time.sleep, 1.0)
    time.sleep(0.1)
    for n in range(40):
        lab.ip("addr", "add", f"198.18.2.{n + 1}/24", "dev", NIC)
    lab.ip("link", "set", PEER, "down")
    _, link = watch.next(lambda link: not link.carrier and len(link.addresses) == 41, timeout=10)
    assert link.present and link.admin_up
    assert "No buffer space available; reopening the socket" in caplog.text  # it did overflow


def encoded(msg: ifinfmsg | ifaddrmsg, kind: int) -> bytes:
    msg["header"]["type"] = kind
    msg.encode()
    return bytes(msg.data)


def link_msg(family: int, name: str, flags: int, operstate: str, carrier: int) -> ifinfmsg:
    msg = ifinfmsg()
    msg["family"], msg["index"], msg["flags"] = family, 7, flags
    msg["attrs"] = [("IFLA_IFNAME", name), ("IFLA_OPERSTATE", operstate), ("IFLA_CARRIER", carrier)]
    return msg


def test_the_carrier_is_the_lower_up_flag_as_the_kernel_sets_it() -> None:
    """IFF_LOWER_UP decides (the kernel sets it only while the link is up and has carrier), whatever an
    IFLA_CARRIER attribute says: the decoder stops before that attribute."""
    up_with_carrier = encoded(link_msg(socket.AF_UNSPEC, NIC, IFF_UP | IFF_LOWER_UP, "UP", 0), RTM_NEWLINK)
    down_with_stale_carrier = encoded(link_msg(socket.AF_UNSPEC, NIC, 0, "DOWN", 1), RTM_NEWLINK)
    assert [m.carrier for m in decode(up_with_carrier + down_with_stale_carrier)] == [True, False]


def test_decode_reads_what_pyroute2_encodes() -> None:
    address = ifaddrmsg()
    address["family"], address["index"], address["prefixlen"] = socket.AF_INET, 7, 24
    address["attrs"] = [("IFA_ADDRESS", "198.18.0.5"), ("IFA_LOCAL", "198.18.0.5")]
    datagram = (
        encoded(link_msg(socket.AF_UNSPEC, NIC, IFF_UP, "LOWERLAYERDOWN", 0), RTM_NEWLINK)
        + encoded(link_msg(AF_BRIDGE, NIC, IFF_UP, "UP", 0), RTM_NEWLINK)  # bridge-port view: skipped
        + encoded(address, RTM_DELADDR)
        + encoded(link_msg(socket.AF_UNSPEC, NIC, 0, "DOWN", 0), RTM_DELLINK)
    )
    assert list(decode(datagram)) == [
        LinkMsg(False, 7, NIC, admin_up=True, operstate="lowerlayerdown", carrier=False),
        AddrMsg(True, 7, "198.18.0.5"),
        LinkMsg(True, 7, NIC, admin_up=False, operstate="down", carrier=False),
    ]


def test_decode_stops_at_a_truncated_message() -> None:
    whole = encoded(link_msg(socket.AF_UNSPEC, NIC, IFF_UP | IFF_LOWER_UP, "UP", 1), RTM_NEWLINK)
    assert list(decode(whole)) == [LinkMsg(False, 7, NIC, True, "up", True)]
    assert list(decode(whole[:10])) == []
    assert list(decode(whole[:40])) == []  # the header promises more than there is
    assert list(decode(b"\0" * 16)) == []  # a zero length must not loop forever
