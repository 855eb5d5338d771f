"""The tcp provider: a software RC transport over kernel TCP on one named netdev, like Soft-iWARP.

Because the bytes really cross that netdev, a link that goes down or black-holes really stops the transport,
and the QP fails the way an RNIC's does (RETRY_EXC_ERR, then WR_FLUSH_ERR). The C core (libshift.core)
moves the bytes; this package finds the devices, opens their sockets and speaks the provider interface.
"""

from __future__ import annotations

from libshift.providers import DeviceInfo, Provider, ProviderContext
from libshift.providers.tcp.context import TcpContext
from libshift.providers.tcp.devices import PROVIDER, load_devices


class TcpProvider(Provider):
    name = PROVIDER

    def devices(self) -> list[DeviceInfo]:
        return load_devices()

    def open(self, device: DeviceInfo) -> ProviderContext:
        return TcpContext(device)
