"""The switch's step moments: nothing kept until asked, then every step in order, on the shared clock,
and never more than LIMIT (a diagnostic switched on and forgotten must not grow the process)."""

from __future__ import annotations

import time

import pytest

from libshift.shift import steps


@pytest.fixture(autouse=True)
def off_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(steps, "_kept", None)  # whatever a test turns on, the next one starts off


def test_nothing_is_kept_unless_asked() -> None:
    steps.note(7, "switch")
    assert steps.kept() == []


def test_steps_are_kept_in_order_on_the_monotonic_clock() -> None:
    before = time.monotonic_ns()
    steps.keep()
    steps.note(0, "nic_event")
    steps.note(7, "switch")
    after = time.monotonic_ns()
    kept = steps.kept()
    assert [(qp, step) for _, qp, step in kept] == [(0, "nic_event"), (7, "switch")]
    assert before <= kept[0][0] <= kept[1][0] <= after
    kept.clear()  # a copy: the caller cannot lose the steps for the next caller
    assert len(steps.kept()) == 2


def test_no_more_than_the_limit_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(steps, "LIMIT", 3)
    steps.keep()
    for n in range(5):
        steps.note(n, "switch")
    assert [qp for _, qp, _ in steps.kept()] == [0, 1, 2]
