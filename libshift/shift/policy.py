"""Which devices back up which: the next NICs of the host, in order, wrapping around.

With two NICs each backs up the other. With more, "next" spreads the backups over all the others instead of
piling every failed NIC's traffic onto one, and the NIC after the backup backs up the backup: a QP on
mlx5_0 of a host with mlx5_0..mlx5_3 moves to mlx5_1 when mlx5_0 fails, and on to mlx5_2 when mlx5_1
fails too. `SHIFT_BACKUPS` says how many backups each QP keeps connected (default 2): each costs a QP, a
twin of every MR and a published mapping per QP and MR, so a host with eight NICs need not keep seven.

Where the device order is not the topology, `SHIFT_BACKUP_DEVICES` names the backups of some devices
("rxe0=rxe2,rxe1=rxe3", a chain as "mlx5_0=mlx5_2:mlx5_3"): one kernel holding two hosts' Soft-RoCE
devices (shiftlab.rxe), where "the next NIC" of rxe0 is its own peer rxe1; a device not named keeps the
rule.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from libshift.device import natural_key
from libshift.shift.paths import MAX_PATHS
from libshift.shift.settings import env_int
from libshift.verbs import VerbsError

BACKUPS = 2


def backup_count() -> int:
    """How many backup paths a resilient QP keeps (SHIFT_BACKUPS)."""
    return env_int("SHIFT_BACKUPS", BACKUPS, 1, MAX_PATHS - 1)


def named_backups() -> dict[str, list[str]]:
    """SHIFT_BACKUP_DEVICES as device -> its backups, in order (empty when unset)."""
    text = os.environ.get("SHIFT_BACKUP_DEVICES", "")
    named: dict[str, list[str]] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        default, equals, chain = item.partition("=")
        backups = chain.split(":")
        if not (default and equals and all(backups)) or default in backups:
            raise VerbsError(
                f"SHIFT_BACKUP_DEVICES: {item!r} is not DEVICE=BACKUP[:BACKUP...] (e.g. rxe0=rxe2,rxe1=rxe3)"
            )
        named[default] = backups
    return named


def backup_devices(default: str, devices: Sequence[str], count: int) -> list[str]:
    """Up to `count` devices after `default` in `devices`, wrapping around (or those SHIFT_BACKUP_DEVICES
    names, of `devices`): the backup first, then the backup's backup; empty when `default` has no other
    device."""
    names = sorted(set(devices), key=natural_key)
    if default not in names:
        return []
    named = named_backups().get(default)
    if named is not None:
        return [name for name in named if name in names][:count]
    at = names.index(default)
    return [names[(at + i) % len(names)] for i in range(1, min(count, len(names) - 1) + 1)]
