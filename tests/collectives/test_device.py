"""Which device a rank takes: its local rank's rail, or SHIFT_DEVICE; from libshift's real device list."""

from __future__ import annotations

import pytest

from libshift.collectives.device import pick_device


@pytest.fixture
def four_nics(monkeypatch):
    """A host with four tcp devices, listed out of order (the natural order must not depend on it)."""
    monkeypatch.setenv("SHIFT_TCP_DEVICES", "mlx5_10=lo,mlx5_2=lo,mlx5_0=lo,mlx5_1=lo")


@pytest.mark.parametrize(
    ("local_rank", "device"),
    [("0", "mlx5_0"), ("1", "mlx5_1"), ("2", "mlx5_2"), ("3", "mlx5_10"), ("5", "mlx5_1")],
)
def test_local_rank_picks_the_rail(four_nics, local_rank, device):
    assert pick_device({"LOCAL_RANK": local_rank}) == device


def test_without_local_rank_the_first_device(four_nics):
    assert pick_device({}) == "mlx5_0"


def test_shift_device_overrides_the_local_rank(four_nics):
    assert pick_device({"LOCAL_RANK": "0", "SHIFT_DEVICE": "mlx5_10"}) == "mlx5_10"


def test_unknown_shift_device_is_named(four_nics):
    with pytest.raises(
        ValueError, match=r"^SHIFT_DEVICE=mlx5_7: no such RDMA device .*mlx5_0, mlx5_1, mlx5_2, mlx5_10"
    ):
        pick_device({"SHIFT_DEVICE": "mlx5_7"})


def test_bad_local_rank_is_named(four_nics):
    with pytest.raises(ValueError, match=r"^LOCAL_RANK='-1': expected a non-negative integer$"):
        pick_device({"LOCAL_RANK": "-1"})


def test_no_device_at_all():
    with pytest.raises(ValueError, match="no RDMA device on this host"):
        pick_device({}, devices=[])
