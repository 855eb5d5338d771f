"""Which paths of a ShiftQP are armed: connected, with our control receive at the head of the queue, so a
switch may go there. The core's switches (fast_switch.c) read the same, so every change is mirrored there."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from libshift.shift.paths import depth


class Armed(dict[str, bool]):
    """path -> whether it is armed; `fast` is the QP's FastQP."""

    def __init__(self, fast: Any, paths: Iterable[str]) -> None:
        super().__init__(dict.fromkeys(paths, False))
        self._fast = fast

    def __setitem__(self, path: str, armed: bool) -> None:
        super().__setitem__(path, armed)
        self._fast.set_armed(depth(path), armed)
