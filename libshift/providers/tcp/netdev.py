"""A tcp device's netdev, looked at from inside its network namespace: its address, its state as a port, and
the sockets the core is handed (made there, bound to the netdev)."""

from __future__ import annotations

import fcntl
import os
import socket
import struct
from collections.abc import Iterator
from contextlib import contextmanager

from libshift.netns import NetnsError, in_netns
from libshift.providers import DeviceInfo
from libshift.vocabulary.attrs import PortAttr
from libshift.vocabulary.enums import ibv_port_state
from libshift.vocabulary.errors import VerbsError

SIOCGIFADDR = 0x8915
SIOCGIFFLAGS = 0x8913
IFF_UP, IFF_RUNNING = 0x1, 0x40


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


def netdev_index(netdev: str, netns: str | None) -> int | None:
    """`netdev`'s ifindex inside the device's namespace; None while there is no such netdev."""
    with device_netns(netns):
        try:
            return socket.if_nametoindex(netdev)
        except OSError:
            return None


def rebind(fd: int, netdev: str) -> None:
    """Bind the socket `fd` (owned elsewhere: the core's listener) to `netdev` as it is now."""
    with socket.socket(fileno=os.dup(fd)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, netdev.encode())


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
    `address` (0.0.0.0: any of the netdev's)."""
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
