"""The tcp provider: a software RC transport over kernel TCP on one named netdev, like Soft-iWARP.

Because the bytes really cross that netdev, a link that goes down or black-holes really stops the transport,
and the QP fails the way an RNIC's does (RETRY_EXC_ERR, then WR_FLUSH_ERR). Two engines implement it on
one wire: the interpreted one here (the default) and the C core's (SHIFT_TCP_ENGINE=native, native.py).
"""

from __future__ import annotations

import os

from libshift.providers import DeviceInfo, Provider, ProviderContext
from libshift.providers.tcp.context import TcpContext
from libshift.providers.tcp.devices import PROVIDER, load_devices

ENV_ENGINE = "SHIFT_TCP_ENGINE"  # "native": the C core moves the bytes (libshift.core)


class TcpProvider(Provider):
    name = PROVIDER

    def devices(self) -> list[DeviceInfo]:
        return load_devices()

    def open(self, device: DeviceInfo) -> ProviderContext:
        if os.environ.get(ENV_ENGINE, "python") == "native":
            from libshift.providers.tcp.native import NativeContext  # the C core, built by the package

            return NativeContext(device)
        return TcpContext(device)
