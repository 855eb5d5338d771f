"""An opened tcp device: its address, its sockets (in its network namespace), keys, and progress engine."""

from __future__ import annotations

import fcntl
import socket
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from libshift.gid import gid_of_ipv4
from libshift.netns import NetnsError, in_netns
from libshift.providers import DeviceInfo, ProviderContext
from libshift.providers.tcp.cq import TcpChannel, TcpCQ
from libshift.providers.tcp.engine import Engine
from libshift.providers.tcp.memory import TcpPD, random_key
from libshift.vocabulary.attrs import DeviceAttr, PortAttr
from libshift.vocabulary.enums import ibv_port_state
from libshift.vocabulary.errors import VerbsError

if TYPE_CHECKING:
    from libshift.providers.tcp.qp import TcpQP

SIOCGIFADDR = 0x8915
SIOCGIFFLAGS = 0x8913
IFF_UP, IFF_RUNNING = 0x1, 0x40
# Both engines take any size memory allows; they answer as a large RNIC would, so that code sized by them
# fits one (64 SGEs: the most the conformance suite gathers).
LIMITS = DeviceAttr(max_cqe=(1 << 22) - 1, max_sge=64, max_qp_wr=1 << 15)


@contextmanager
def device_netns(netns: str | None) -> Iterator[None]:
    """`in_netns` for a device's `@netns`: a missing namespace is a verbs error, as for any bad device."""
    try:
        with in_netns(netns):
            yield
    except NetnsError as exc:
        raise VerbsError(str(exc)) from None


def netdev_ipv4(netdev: str, netns: str | None) -> str:
    """The IPv4 address of `netdev`, looked up inside the device's namespace."""
    with device_netns(netns), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            reply = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, struct.pack("256s", netdev.encode()[:15]))
        except OSError as exc:
            where = f" in netns {netns}" if netns else ""
            raise VerbsError(
                f"netdev {netdev!r}{where} has no usable IPv4 address ({exc.strerror})"
            ) from None
    return socket.inet_ntoa(reply[20:24])


def netdev_port(netdev: str, netns: str | None) -> PortAttr:
    """The netdev as a port: ACTIVE while it is up with its carrier (IFF_UP and IFF_RUNNING), else DOWN."""
    with device_netns(netns), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            reply = fcntl.ioctl(probe.fileno(), SIOCGIFFLAGS, struct.pack("256s", netdev.encode()[:15]))
        except OSError:
            return PortAttr(ibv_port_state.IBV_PORT_DOWN)  # gone: no port either
    flags = struct.unpack_from("H", reply, 16)[0]
    up = flags & IFF_UP and flags & IFF_RUNNING
    return PortAttr(ibv_port_state.IBV_PORT_ACTIVE if up else ibv_port_state.IBV_PORT_DOWN)


def device_socket(device: DeviceInfo, address: str) -> socket.socket:
    """A non-blocking TCP socket in the device's namespace, bound to its netdev (SO_BINDTODEVICE) and
    address."""
    with device_netns(device.netns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, device.netdev.encode())
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((address, 0))
    except OSError as exc:
        sock.close()
        raise VerbsError(f"device {device.name}: cannot bind to {device.netdev}: {exc.strerror}") from None
    sock.setblocking(False)
    return sock


class TcpDevice(ProviderContext):
    """What both engines' contexts answer alike: the device is its netdev, its address and its state."""

    def __init__(self, device: DeviceInfo) -> None:
        self.device = device
        self.address = netdev_ipv4(device.netdev, device.netns)

    def gid(self) -> str:
        return gid_of_ipv4(self.address)

    def query_device(self) -> DeviceAttr:
        return LIMITS

    def query_port(self) -> PortAttr:
        return netdev_port(self.device.netdev, self.device.netns)

    def new_socket(self) -> socket.socket:
        return device_socket(self.device, self.address)


class TcpContext(TcpDevice):
    def __init__(self, device: DeviceInfo) -> None:
        super().__init__(device)
        self.engine = Engine(device.name)
        self.qps: set[TcpQP] = set()
        self._keys: set[int] = set()

    def new_key(self) -> int:
        key = random_key(self._keys)
        self._keys.add(key)
        return key

    def release_key(self, key: int) -> None:
        self._keys.discard(key)

    def alloc_pd(self) -> TcpPD:
        return TcpPD(self)

    def create_comp_channel(self) -> TcpChannel:
        return TcpChannel(self.engine)

    def create_cq(self, cqe: int, channel: TcpChannel | None) -> TcpCQ:  # type: ignore[override]
        return TcpCQ(cqe, channel, self.engine.poll_once)

    def close(self) -> None:
        with self.engine.lock:
            for qp in list(self.qps):
                qp.close()
        self.engine.stop()
