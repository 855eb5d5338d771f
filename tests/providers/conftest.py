"""The tcp provider's tests' loopback device: a Context that needs no lab."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from libshift.verbs import Context


@pytest.fixture
def lo_context(monkeypatch: pytest.MonkeyPatch) -> Iterator[Context]:
    """A tcp device on the loopback netdev, opened (and closed after the test)."""
    monkeypatch.setenv("SHIFT_TCP_DEVICES", "tcp_lo=lo")
    ctx = Context(name="tcp_lo")
    yield ctx
    ctx.close()
