"""Which device backs up which: the next NIC of the host by default.

With two NICs each backs up the other; with more, "next" spreads the backups over all the others instead of
piling every failed NIC's traffic onto one.
"""

from __future__ import annotations

from collections.abc import Sequence


def backup_device(default: str, devices: Sequence[str]) -> str | None:
    """The device after `default` in `devices` (wrapping around), or None when it has no other device."""
    names = sorted(set(devices), key=_natural)
    if default not in names or len(names) < 2:
        return None
    return names[(names.index(default) + 1) % len(names)]


def _natural(name: str) -> tuple[str, int]:
    """mlx5_2 before mlx5_10: sort by the text, then by the trailing number."""
    stem = name.rstrip("0123456789")
    digits = name[len(stem) :]
    return stem, int(digits) if digits else -1
