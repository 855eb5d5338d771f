"""Two tcp-provider Contexts on the two ends of a VethPair, without shiftd or a lab.

SHIFT_TCP_DEVICES names the pair's devices `{prefix}_a` and `{prefix}_b` for as long as the block runs
and is restored after, whatever it was.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from libshift.verbs import Context
from shiftlab.veth import VethPair


@contextmanager
def veth_contexts(prefix: str, subnet: str) -> Iterator[tuple[VethPair, Context, Context]]:
    with VethPair(prefix, subnet) as fabric, pytest.MonkeyPatch.context() as env:
        env.setenv("SHIFT_TCP_DEVICES", fabric.tcp_devices(f"{prefix}_a", f"{prefix}_b"))
        a, b = Context(name=f"{prefix}_a"), Context(name=f"{prefix}_b")
        try:
            yield fabric, a, b
        finally:
            a.close()
            b.close()
