"""The moments of each switch's steps, kept only while a diagnostic asks for them.

`bench/failover_downtime.py --steps` turns them on in both peers to show where a failover's downtime goes:
when the NIC event reached the context, and when each QP began to switch, had stopped its old path, began
to send its receive count, had the peer's count, and had posted its replay. The times are CLOCK_MONOTONIC,
which every process of the machine shares, so both peers' steps line up with the instant of the fault.
Off (the default) a step costs a call and the test of one global: the steps are on the switch's path,
never on the per-message one.
"""

from __future__ import annotations

import time

LIMIT = 100_000  # steps kept at most: enough for a benchmark's trials, bounded for a forgotten switch-on

Step = tuple[int, int, str]  # (CLOCK_MONOTONIC ns, QP number or 0 for the context, step)

_kept: list[Step] | None = None


def keep() -> None:
    """From now on, keep the steps of this process's switches."""
    global _kept
    _kept = []


def note(qp_num: int, step: str, at_ns: int | None = None) -> None:
    """Keep a step, now or at `at_ns` (a moment the core took on the same clock)."""
    kept = _kept
    if kept is not None and len(kept) < LIMIT:
        kept.append((time.monotonic_ns() if at_ns is None else at_ns, qp_num, step))


def kept() -> list[Step]:
    """The steps kept so far, oldest first (none when keeping was never turned on)."""
    return list(_kept or ())
