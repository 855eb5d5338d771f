"""A backup path's control CQ fits its device: CONTROL_CQE, capped by the device's max_cqe."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from libshift.shift.context import CONTROL_CQE, control_cqe
from libshift.verbs import DeviceAttr


@dataclass
class FakeDevice:
    max_cqe: int

    def query_device(self) -> DeviceAttr:
        return DeviceAttr(max_cqe=self.max_cqe, max_sge=32, max_qp_wr=16384)


@pytest.mark.parametrize(
    ("max_cqe", "expected"),
    [
        (32767, 32767),  # rxe: CONTROL_CQE does not fit
        ((1 << 22) - 1, CONTROL_CQE),  # mlx5, and the tcp provider
        (CONTROL_CQE, CONTROL_CQE),
    ],
)
def test_the_control_cq_is_capped_by_the_devices_max_cqe(max_cqe: int, expected: int) -> None:
    assert control_cqe(FakeDevice(max_cqe)) == expected  # type: ignore[arg-type]
