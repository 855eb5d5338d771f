"""Device discovery across every provider: what `Context(name=...)` can open."""

from __future__ import annotations

from libshift.providers import DeviceInfo, Provider, providers


def get_device_list() -> list[DeviceInfo]:
    """The devices of every available provider, as pyverbs' get_device_list() lists RNICs."""
    return [device for provider in providers() for device in provider.devices()]


def find_device(name: str, provider: str | None = None) -> tuple[Provider, DeviceInfo]:
    """The provider and device called `name` (optionally only from the provider called `provider`)."""
    from libshift.verbs.errors import VerbsError  # here: libshift.verbs imports this module at load time

    seen = []
    for candidate in providers():
        if provider is not None and candidate.name != provider:
            continue
        for device in candidate.devices():
            if device.name == name:
                return candidate, device
            seen.append(device.name)
    known = ", ".join(seen) or "none"
    raise VerbsError(f"no RDMA device {name!r} (known devices: {known})")
