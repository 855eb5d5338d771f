"""The backup-device policy: the next NICs of the host, wrapping, spread over all NICs; how many."""

import pytest

from libshift.shift.policy import BACKUPS, backup_count, backup_devices
from libshift.verbs import VerbsError


def test_two_nics_back_each_other_up() -> None:
    assert backup_devices("mlx5_0", ["mlx5_0", "mlx5_1"], 2) == ["mlx5_1"]
    assert backup_devices("mlx5_1", ["mlx5_1", "mlx5_0"], 2) == ["mlx5_0"]


def test_more_nics_spread_the_backups_in_natural_order() -> None:
    devices = [f"mlx5_{i}" for i in (10, 2, 0, 1)]
    assert [backup_devices(d, devices, 1) for d in ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_10")] == [
        ["mlx5_1"],
        ["mlx5_2"],
        ["mlx5_10"],
        ["mlx5_0"],
    ]


def test_the_backups_backup_is_the_nic_after_it() -> None:
    devices = [f"mlx5_{i}" for i in range(4)]
    assert backup_devices("mlx5_0", devices, 2) == ["mlx5_1", "mlx5_2"]
    assert backup_devices("mlx5_3", devices, 2) == ["mlx5_0", "mlx5_1"]
    assert backup_devices("mlx5_2", devices, 7) == ["mlx5_3", "mlx5_0", "mlx5_1"]  # never itself


def test_no_backup_without_another_device() -> None:
    assert backup_devices("mlx5_0", ["mlx5_0"], 2) == []
    assert backup_devices("mlx5_7", ["mlx5_0", "mlx5_1"], 2) == []


def test_shift_backups_sets_how_many(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHIFT_BACKUPS", raising=False)
    assert backup_count() == BACKUPS == 2
    monkeypatch.setenv("SHIFT_BACKUPS", "1")
    assert backup_count() == 1
    for bad in ("0", "8", "two"):
        monkeypatch.setenv("SHIFT_BACKUPS", bad)
        with pytest.raises(VerbsError, match="SHIFT_BACKUPS must be an integer from 1 to 7"):
            backup_count()


def test_shift_backup_devices_names_backups_where_the_order_is_not_the_topology(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    devices = ["rxe0", "rxe1", "rxe2", "rxe3"]
    monkeypatch.setenv("SHIFT_BACKUP_DEVICES", "rxe0=rxe2, rxe1=rxe3:rxe9:rxe2")
    assert backup_devices("rxe0", devices, 2) == ["rxe2"]
    assert backup_devices("rxe1", devices, 2) == ["rxe3", "rxe2"]  # one not on the host is left out
    assert backup_devices("rxe1", devices, 1) == ["rxe3"]
    assert backup_devices("rxe2", devices, 1) == ["rxe3"]  # not named: the next NIC
    for bad in ("rxe0", "rxe0=", "=rxe2", "rxe0=rxe2::rxe3", "rxe0=rxe0"):
        monkeypatch.setenv("SHIFT_BACKUP_DEVICES", bad)
        with pytest.raises(VerbsError, match=r"SHIFT_BACKUP_DEVICES: .* is not DEVICE=BACKUP"):
            backup_devices("rxe0", devices, 2)
