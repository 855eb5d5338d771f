"""Device discovery across every provider: what `Context(name=...)` can open.

The providers are asked in order: tcp (devices an operator configured by name), then verbs (RNICs found by
rdma-core). The verbs provider imports pyverbs only when it is asked for its devices, and answers with none
where pyverbs or RDMA is missing, so discovery never fails for want of rdma-core.
"""

from __future__ import annotations

from libshift.providers import DeviceInfo, Provider
from libshift.providers.tcp import TcpProvider
from libshift.providers.verbs import VerbsProvider
from libshift.vocabulary.errors import VerbsError


def providers() -> list[Provider]:
    """Every provider this installation offers, in the order a device name is looked up."""
    return [TcpProvider(), VerbsProvider()]


def get_device_list() -> list[DeviceInfo]:
    """The devices of every available provider, as pyverbs' get_device_list() lists RNICs."""
    return [device for provider in providers() for device in provider.devices()]


def find_device(name: str, provider: str | None = None) -> tuple[Provider, DeviceInfo]:
    """The provider and device called `name` (optionally only from the provider called `provider`)."""
    seen = []
    why_none = []
    for candidate in providers():
        if provider is not None and candidate.name != provider:
            continue
        devices = candidate.devices()
        for device in devices:
            if device.name == name:
                return candidate, device
            seen.append(device.name)
        if not devices and candidate.unavailable:
            why_none.append(f"{candidate.name}: {candidate.unavailable}")
    known = ", ".join(seen) or "none"
    because = f"; {'; '.join(why_none)}" if why_none and (provider is not None or not seen) else ""
    raise VerbsError(f"no RDMA device {name!r} (known devices: {known}){because}")


def natural_key(name: str) -> tuple[str, int]:
    """The sort key of device names in natural order, mlx5_2 before mlx5_10: the text, then the trailing
    number."""
    stem = name.rstrip("0123456789")
    digits = name[len(stem) :]
    return stem, int(digits) if digits else -1
