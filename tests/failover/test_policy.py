"""The backup-device policy: the next NIC of the host, wrapping, spread over all NICs."""

from libshift.shift.policy import backup_device


def test_two_nics_back_each_other_up() -> None:
    assert backup_device("mlx5_0", ["mlx5_0", "mlx5_1"]) == "mlx5_1"
    assert backup_device("mlx5_1", ["mlx5_1", "mlx5_0"]) == "mlx5_0"


def test_more_nics_spread_the_backups_in_natural_order() -> None:
    devices = [f"mlx5_{i}" for i in (10, 2, 0, 1)]
    assert [backup_device(d, devices) for d in ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_10")] == [
        "mlx5_1",
        "mlx5_2",
        "mlx5_10",
        "mlx5_0",
    ]


def test_no_backup_without_another_device() -> None:
    assert backup_device("mlx5_0", ["mlx5_0"]) is None
    assert backup_device("mlx5_7", ["mlx5_0", "mlx5_1"]) is None
