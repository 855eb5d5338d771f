"""The lab fabric: hosts, rail switches and a management network, all network namespaces.

Shaped like a rail-optimized GPU cluster: NIC r of every host plugs into rail switch r (a bridge
in its own namespace), so rails are separate L2 networks, joined by a router, the spine (shiftlab.spine);
a management bridge carries etcd.
Every veth pair is created directly across namespaces (one end in the host, its peer in the
switch), so no link ever appears in the root namespace, not even when a step fails halfway.

A lab on the rxe provider is the exception: its hosts' NICs and management ends stay in the initial
namespace, cabled to the same switches, because rdma_rxe on kernel 6.1 sends only from there
(shiftlab/softroce.py); their names then carry the host's (h0-ens1f0np0, h0-mgmt0). It has no spine.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import struct
import time
from contextlib import ExitStack
from dataclasses import dataclass

from pyroute2 import IPRoute
from pyroute2 import netns as pyroute2_netns
from pyroute2.netlink.exceptions import NetlinkError

from shiftlab import netns, spine

BRIDGE = "br0"
MGMT_NETDEV = "mgmt0"
MGMT_GATEWAY = "198.19.0.1"  # the management bridge; etcd (its first member) listens here
ETCD_MEMBER_COUNTS = (1, 3, 5)  # an etcd cluster has an odd number of members
PREFIXLEN = 24
MGMT_RAIL_ID = 0xFF  # stands for the management network in MAC addresses
MAX_HOSTS = 64
MAX_NICS = 8
PROVIDERS = ("tcp", "rxe")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")
# Strict ARP, as on real multi-rail RoCE hosts: a host answers ARP only on the NIC that owns the
# address, so a packet forced out of one rail reaches another rail's address only through the spine.
# accept_local: what one NIC sends to another of the same host arrives over the wire (shiftlab.spine).
HOST_SYSCTLS = {
    "net/ipv4/conf/all/arp_ignore": "1",
    "net/ipv4/conf/all/arp_announce": "2",
    "net/ipv4/conf/all/accept_local": "1",
}


class FabricError(RuntimeError):
    """A bad shape or a fabric that cannot be built; str() is one line for the operator."""


@dataclass(frozen=True)
class Shape:
    """A lab's size and, derived from it, every name and address in the fabric."""

    name: str = "shift"
    hosts: int = 2
    nics: int = 2
    etcd_members: int = 1
    provider: str = "tcp"  # "rxe": Soft-RoCE devices on the NICs, which stay in the initial namespace

    def __post_init__(self) -> None:
        if not NAME_RE.fullmatch(self.name):
            raise FabricError(
                f"lab name {self.name!r}: use 1-32 letters, digits, '-' or '_', starting with a letter"
                " or digit"
            )
        if not 1 <= self.hosts <= MAX_HOSTS:
            raise FabricError(f"--hosts must be between 1 and {MAX_HOSTS}, not {self.hosts}")
        if not 1 <= self.nics <= MAX_NICS:
            raise FabricError(f"--nics must be between 1 and {MAX_NICS}, not {self.nics}")
        if self.etcd_members not in ETCD_MEMBER_COUNTS:
            counts = ", ".join(map(str, ETCD_MEMBER_COUNTS))
            raise FabricError(f"--etcd-members must be one of {counts}, not {self.etcd_members}")
        if self.provider not in PROVIDERS:
            raise FabricError(f"--provider must be one of {', '.join(PROVIDERS)}, not {self.provider!r}")

    @property
    def in_initial_ns(self) -> bool:
        """Whether the hosts' netdevs (and processes) are in the initial namespace, not one each."""
        return self.provider == "rxe"

    @property
    def host_names(self) -> list[str]:
        return [f"h{i}" for i in range(self.hosts)]

    def host_ns(self, i: int) -> str:
        return f"{self.name}-h{i}"

    def rail_ns(self, r: int) -> str:
        return f"{self.name}-rail{r}"

    @property
    def mgmt_ns(self) -> str:
        return f"{self.name}-mgmt"

    @property
    def spine_ns(self) -> str | None:
        """The spine's namespace; None on rxe, whose hosts share the initial one (shiftlab.softroce)."""
        return None if self.in_initial_ns else f"{self.name}-spine"

    @property
    def namespaces(self) -> list[str]:
        hosts = [] if self.in_initial_ns else [self.host_ns(i) for i in range(self.hosts)]
        spines = [] if self.spine_ns is None else [self.spine_ns]
        return [*hosts, *(self.rail_ns(r) for r in range(self.nics)), *spines, self.mgmt_ns]

    @staticmethod
    def netdev(r: int) -> str:
        """Host netdev of rail r, named like a ConnectX port: ens1f0np0, ens2f0np0, ..."""
        return f"ens{r + 1}f0np0"

    @staticmethod
    def rdma_device(r: int) -> str:
        return f"mlx5_{r}"

    def nic_netdev(self, i: int, r: int) -> str:
        """Host i's netdev of rail r: unique in the initial namespace when the hosts share it."""
        return f"h{i}-{self.netdev(r)}" if self.in_initial_ns else self.netdev(r)

    def mgmt_netdev(self, i: int) -> str:
        return f"h{i}-{MGMT_NETDEV}" if self.in_initial_ns else MGMT_NETDEV

    @staticmethod
    def rail_address(r: int, i: int) -> str:
        return f"198.18.{r}.{10 + i}"

    @staticmethod
    def mgmt_address(i: int) -> str:
        return f"198.19.0.{10 + i}"

    @staticmethod
    def etcd_address(m: int) -> str:
        """Member m of the etcd cluster: an address of its own on the management bridge, below the hosts'."""
        return f"198.19.0.{1 + m}"

    def devices(self) -> dict[str, str]:
        """RDMA device name -> netdev, the same on every host (of the tcp provider)."""
        return {self.rdma_device(r): self.netdev(r) for r in range(self.nics)}

    def host_devices(self, i: int) -> dict[str, str]:
        """RDMA device name -> netdev of host i; rxe devices are named by host, as one kernel holds all."""
        if not self.in_initial_ns:
            return self.devices()
        return {f"h{i}_rxe{r}": self.nic_netdev(i, r) for r in range(self.nics)}

    def host_addresses(self, i: int) -> dict[str, str]:
        """netdev -> address/prefix of host i."""
        addresses = {
            self.nic_netdev(i, r): f"{self.rail_address(r, i)}/{PREFIXLEN}" for r in range(self.nics)
        }
        addresses[self.mgmt_netdev(i)] = f"{self.mgmt_address(i)}/{PREFIXLEN}"
        return addresses


@dataclass(frozen=True)
class Nic:
    """A host end of a veth: its name, its MAC and its address."""

    netdev: str
    mac: str
    address: str


def nic_mac(rail: int, host: int) -> str:
    """A fixed, locally administered MAC per (rail, host).

    A re-created NIC keeps its MAC, so the peers' ARP caches stay right, as after a cable swap.
    """
    return f"02:53:48:{rail:02x}:{host >> 8:02x}:{host & 0xFF:02x}"


def present(name: str) -> list[str]:
    """The namespaces of lab `name` that exist now, whatever shape the lab was built with."""
    pattern = re.compile(rf"{re.escape(name)}-(h\d+|rail\d+|spine|mgmt)")
    return [ns for ns in netns.names() if pattern.fullmatch(ns)]


def build(shape: Shape) -> None:
    """Create whatever part of the fabric is missing (so a second build reuses the first).

    On failure the whole lab is removed: a half-built fabric only confuses the next attempt.
    """
    try:
        _build(shape)
    except BaseException:
        destroy(shape.name)
        raise


def _build(shape: Shape) -> None:
    for ns in shape.namespaces:
        if not netns.exists(ns):
            pyroute2_netns.create(ns)
    with ExitStack() as stack:
        ipr = {ns: stack.enter_context(IPRoute(netns=ns, flags=0)) for ns in shape.namespaces}
        initial = stack.enter_context(IPRoute()) if shape.in_initial_ns else None
        for sock in ipr.values():
            sock.link("set", index=sock.link_lookup(ifname="lo")[0], state="up")
        switches = [shape.rail_ns(r) for r in range(shape.nics)] + [shape.mgmt_ns]
        for ns in switches:
            _ensure_bridge(ipr[ns])
        mgmt = ipr[shape.mgmt_ns]
        for m in range(shape.etcd_members):
            _ensure_address(mgmt, mgmt.link_lookup(ifname=BRIDGE)[0], shape.etcd_address(m))
        for i in range(shape.hosts):
            if initial is None:  # the initial namespace's sysctls are softroce's, per netdev
                netns.run(shape.host_ns(i), _write_sysctls, HOST_SYSCTLS)
            host = initial or ipr[shape.host_ns(i)]
            port = f"h{i}"
            for r in range(shape.nics):
                rail = shape.rail_ns(r)
                nic = Nic(shape.nic_netdev(i, r), nic_mac(r, i), shape.rail_address(r, i))
                _ensure_nic(host, nic, ipr[rail], rail, port)
                if shape.spine_ns is not None:
                    spine.route(host, r, nic.netdev)
            nic = Nic(shape.mgmt_netdev(i), nic_mac(MGMT_RAIL_ID, i), shape.mgmt_address(i))
            _ensure_nic(host, nic, mgmt, shape.mgmt_ns, port)
        if shape.spine_ns is not None:
            _ensure_spine(shape, ipr)
    for i in range(shape.hosts):  # all at once: each waits for the same run of the kernel's link watcher
        ns = None if shape.in_initial_ns else shape.host_ns(i)
        for netdev in [*(shape.nic_netdev(i, r) for r in range(shape.nics)), shape.mgmt_netdev(i)]:
            wait_operational(ns, netdev)
    for r in range(shape.nics if shape.spine_ns is not None else 0):
        wait_operational(shape.spine_ns, spine.leg(r))


def _ensure_spine(shape: Shape, ipr: dict[str, IPRoute]) -> None:
    """The spine: a leg in each rail switch, forwarding between them."""
    assert shape.spine_ns is not None
    netns.run(shape.spine_ns, _write_sysctls, spine.FORWARDING)
    for r in range(shape.nics):
        rail = shape.rail_ns(r)
        nic = Nic(spine.leg(r), nic_mac(r, spine.HOST_ID), spine.address(r))
        _ensure_nic(ipr[shape.spine_ns], nic, ipr[rail], rail, spine.PORT)


def wait_operational(ns: str | None, netdev: str, timeout: float = 5.0) -> None:
    """Until the kernel calls `netdev` (in namespace `ns`, or the initial one) operationally UP. A veth's
    carrier comes on at once, but the kernel's link watcher marks it UP and attaches its qdisc only when it
    runs, up to a second later: until then the link drops what it is given, and a shiftd that starts
    meanwhile says the NIC is DOWN, and holds it down for its hold-down after it comes up (a stream that
    connected then ran on the backup from the start). FabricError after `timeout` s."""
    deadline = time.monotonic() + timeout
    with IPRoute(netns=ns, flags=0) if ns is not None else IPRoute() as sock:
        while True:
            links = sock.get_links(ifname=netdev)
            state = links[0].get_attr("IFLA_OPERSTATE") if links else None
            if state == "UP":
                return
            if time.monotonic() > deadline:
                where = f" in {ns}" if ns is not None else ""
                raise FabricError(f"{netdev}{where}: not UP after {timeout:.0f} s ({state})")
            time.sleep(0.01)


def _write_sysctls(values: dict[str, str]) -> None:
    """Write sysctls of the calling thread's namespace (/proc/sys/net follows the opener's netns)."""
    for key, value in values.items():
        with open(f"/proc/sys/{key}", "w") as f:
            f.write(value)


def _ensure_bridge(sock: IPRoute) -> None:
    if not sock.link_lookup(ifname=BRIDGE):
        sock.link("add", ifname=BRIDGE, kind="bridge")
    sock.link("set", index=sock.link_lookup(ifname=BRIDGE)[0], state="up")


def _ensure_nic(host: IPRoute, nic: Nic, switch: IPRoute, switch_ns: str, port: str) -> None:
    """A veth from the host's NIC to bridge port `port` of the switch, addressed and up."""
    if not host.link_lookup(ifname=nic.netdev):
        for index in switch.link_lookup(ifname=port):  # a stale port whose host end is gone
            switch.link("del", index=index)
        peer = {"ifname": port, "net_ns_fd": switch_ns}
        host.link("add", ifname=nic.netdev, address=nic.mac, kind="veth", peer=peer)
    switch.link(
        "set",
        index=switch.link_lookup(ifname=port)[0],
        master=switch.link_lookup(ifname=BRIDGE)[0],
        state="up",
    )
    index = host.link_lookup(ifname=nic.netdev)[0]
    _ensure_address(host, index, nic.address)
    host.link("set", index=index, state="up")


def _ensure_address(sock: IPRoute, index: int, address: str) -> None:
    try:
        sock.addr("add", index=index, address=address, prefixlen=PREFIXLEN)
    except NetlinkError as exc:
        if exc.code != errno.EEXIST:
            raise


def destroy(name: str) -> list[str]:
    """Remove every namespace of lab `name` and every link in them; returns what was removed.

    Links are deleted before the namespace is unmounted because a process still inside would keep
    the namespace, and with it the links, alive.
    """
    removed = []
    for ns in present(name):
        try:
            with IPRoute(netns=ns, flags=0) as sock:
                for link in sock.get_links():
                    if link.get("ifname") != "lo":
                        _delete_link(sock, link["index"])
        except FileNotFoundError:
            continue
        pyroute2_netns.remove(ns)
        removed.append(ns)
    return removed


def _delete_link(sock: IPRoute, index: int) -> None:
    try:
        sock.link("del", index=index)
    except NetlinkError as exc:
        if exc.code != errno.ENODEV:  # already gone with its veth peer
            raise


def ping(ns: str, address: str, timeout: float = 1.0, device: str | None = None) -> bool:
    """Send one ICMP echo from namespace `ns` (optionally only out of `device`) and wait for the reply.

    The lab's reachability probe; a raw socket needs no ping binary, which lab machines may lack.
    """
    sock = netns.run(ns, socket.socket, socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    with sock:
        if device:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, device.encode())
        ident, seq = int.from_bytes(os.urandom(2), "big"), 1
        try:
            sock.sendto(_echo_request(ident, seq), (address, 0))
        except OSError:  # no route, or the device is down
            return False
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            try:
                data, (source, _) = sock.recvfrom(2048)
            except TimeoutError:
                return False
            header = (data[0] & 0x0F) * 4
            kind, _code, _sum, reply_ident, reply_seq = struct.unpack_from("!BBHHH", data, header)
            if kind == 0 and source == address and (reply_ident, reply_seq) == (ident, seq):
                return True
        return False


def _echo_request(ident: int, seq: int) -> bytes:
    payload = b"shift-lab"
    header = struct.pack("!BBHHH", 8, 0, 0, ident, seq)
    return struct.pack("!BBHHH", 8, 0, _checksum(header + payload), ident, seq) + payload


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF
