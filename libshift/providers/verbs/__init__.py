"""The verbs provider: real RDMA (RoCE, InfiniBand) through the core's verbs backend (libshift.core._verbs,
which drives libibverbs from C), with pyverbs for discovery and the devices' attributes.

Importing this package imports nothing of pyverbs; listing devices does, once. Where pyverbs is missing,
or rdma-core finds no device (ibv_get_device_list fails, with ENOSYS, where the kernel has no RDMA
support), the provider has no devices and `unavailable` says why; neither is an error.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from libshift.providers import DeviceInfo, Provider
from libshift.providers.verbs.binding import PyverbsMissing, load, one_line
from libshift.providers.verbs.gid import ETHERNET, port_dir, port_netdev, read_attr

if TYPE_CHECKING:
    from libshift.providers.verbs.context import VerbsContext

PROVIDER = "verbs"
SYSFS = Path("/sys")


class VerbsProvider(Provider):
    name = PROVIDER

    def __init__(self, sysfs_root: Path = SYSFS) -> None:
        self.sysfs_root = sysfs_root
        self.unavailable = ""  # why devices() found none, for logs and test skips

    def devices(self) -> list[DeviceInfo]:
        try:
            pv = load()
        except PyverbsMissing as exc:
            self.unavailable = str(exc)
            return []
        try:
            found = pv.device.get_device_list()
        except pv.error as exc:
            self.unavailable = (
                f"rdma-core found no RDMA device ({one_line(exc)}: no device, or no RDMA in the kernel)"
            )
            return []
        names = sorted(_text(device.name) for device in found)
        self.unavailable = "" if names else "rdma-core found no RDMA device"
        return [DeviceInfo(name=name, provider=PROVIDER, netdev=self._netdev(name)) for name in names]

    def _netdev(self, name: str) -> str:
        """Port 1's own netdev (RoCE); "" on InfiniBand or when sysfs does not say."""
        link_layer = read_attr(port_dir(self.sysfs_root, name, 1) / "link_layer")
        return port_netdev(self.sysfs_root, name, 1) if link_layer == ETHERNET else ""

    def open(self, device: DeviceInfo) -> VerbsContext:
        from libshift.providers.verbs.context import VerbsContext

        return VerbsContext(device, self.sysfs_root)


def _text(name: bytes | str) -> str:
    return name.decode() if isinstance(name, bytes) else name
