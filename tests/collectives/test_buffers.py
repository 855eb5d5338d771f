"""buffers.py's choice between registering an array in place and copying it into the work buffer."""

from __future__ import annotations

import numpy as np
import pytest

from libshift.collectives import buffers
from libshift.collectives.buffers import IN_PLACE_MIN, REUSED_MIN, SEEN, Buffers


class FakeMR:
    """Stands for ShiftMR: records what was registered (the policy under test needs no device)."""

    registered: list[int] = []

    def __init__(self, pd: object, length: int, access: int, buffer: np.ndarray | None = None) -> None:
        self.length, self.buffer = length, buffer
        FakeMR.registered.append(length)

    def close(self) -> None:
        pass


@pytest.fixture
def kept(monkeypatch) -> Buffers:
    monkeypatch.setattr(buffers, "ShiftMR", FakeMR)
    FakeMR.registered = []
    return Buffers(pd=None)  # type: ignore[arg-type]


def test_a_large_array_is_registered_at_once_and_kept(kept: Buffers) -> None:
    a = np.zeros(IN_PLACE_MIN, np.uint8)
    first, second = kept.in_place(a), kept.in_place(a)
    assert first is not None and second is not None and first.mr is second.mr
    assert FakeMR.registered == [IN_PLACE_MIN]


def test_a_middle_sized_array_is_copied_once_then_registered_when_it_comes_again(kept: Buffers) -> None:
    a = np.zeros(REUSED_MIN, np.uint8)
    assert kept.in_place(a) is None  # the first time: copied
    again = kept.in_place(a)
    assert again is not None and again.data.ctypes.data == a.ctypes.data
    assert kept.in_place(a).mr is again.mr  # kept from then on
    assert FakeMR.registered == [REUSED_MIN]


def test_small_read_only_and_long_forgotten_arrays_are_copied(kept: Buffers) -> None:
    small = np.zeros(REUSED_MIN - 1, np.uint8)
    assert kept.in_place(small) is None and kept.in_place(small) is None
    frozen = np.zeros(REUSED_MIN, np.uint8)
    frozen.flags.writeable = False
    assert kept.in_place(frozen) is None and kept.in_place(frozen) is None
    arrays = [np.zeros(REUSED_MIN, np.uint8) for _ in range(SEEN + 1)]
    for a in arrays:
        assert kept.in_place(a) is None
    assert kept.in_place(arrays[0]) is None  # forgotten meanwhile: a first time again
    assert kept.in_place(arrays[-1]) is not None
    assert FakeMR.registered == [REUSED_MIN]
