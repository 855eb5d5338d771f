"""libshift.devicetable: one grammar for the tcp devices, and how each reader reports a bad entry.

The daemon reads the config file's `[devices]` (shiftd.config); the tcp provider reads SHIFT_TCP_DEVICES or
the same file (libshift.providers.tcp.devices). A file gets the same verdict from both.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from libshift.devicetable import DeviceEntry, DeviceTableError, parse_list, parse_table
from libshift.providers.tcp.devices import from_config, from_env, load_devices
from libshift.verbs import VerbsError
from shiftd import config

# the table


def test_a_table_maps_devices_to_netdevs_in_its_order() -> None:
    table = {"mlx5_1": "ens2f0np0", "mlx5_0": "ens1f0np0", "tcp.0-a": "veth_0.100"}
    assert parse_table(table) == [
        DeviceEntry("mlx5_1", "ens2f0np0"),
        DeviceEntry("mlx5_0", "ens1f0np0"),
        DeviceEntry("tcp.0-a", "veth_0.100"),
    ]
    assert parse_table({}) == []


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("mlx5_0=eth0", 'devices: must be a table of device = "netdev"'),
        (["eth0"], 'devices: must be a table of device = "netdev"'),
        (
            {"mlx5 0": "eth0"},
            "devices.mlx5 0: not a valid device name (1-64 letters, digits, '_', '.' or '-')",
        ),
        ({"m" * 65: "eth0"}, f"devices.{'m' * 65}: not a valid device name"),
        ({"": "eth0"}, "devices.: not a valid device name"),
        (
            {"mlx5_0": "name-far-too-long"},
            "devices.mlx5_0: 'name-far-too-long' is not a valid network interface",
        ),
        ({"mlx5_0": ""}, "devices.mlx5_0: '' is not a valid network interface name"),
        ({"mlx5_0": "eth 0"}, "devices.mlx5_0: 'eth 0' is not a valid network interface name"),
        ({"mlx5_0": "eth0:1"}, "devices.mlx5_0: 'eth0:1' is not a valid network interface name"),
        ({"mlx5_0": "a/b"}, "devices.mlx5_0: 'a/b' is not a valid network interface name"),
        ({"mlx5_0": 3}, "devices.mlx5_0: 3 is not a valid network interface name"),
        (
            {"mlx5_0": "eth0@h0"},
            "devices.mlx5_0: 'eth0@h0' is not a valid network interface name (@netns belongs in"
            " SHIFT_TCP_DEVICES only)",
        ),
        (
            {"mlx5_0": "eth0", "mlx5_1": "eth0"},
            "devices.mlx5_1: netdev 'eth0' is already used by another device",
        ),
    ],
)
def test_a_bad_table_names_the_entry_and_the_rule(table: object, message: str) -> None:
    with pytest.raises(DeviceTableError) as info:
        parse_table(table)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_a_netdev_name_may_be_fifteen_bytes() -> None:
    assert parse_table({"mlx5_0": "a" * 15}) == [DeviceEntry("mlx5_0", "a" * 15)]


# SHIFT_TCP_DEVICES


def test_a_list_names_devices_netdevs_and_namespaces() -> None:
    assert parse_list(" mlx5_0 = ens1f0np0 , mlx5_1=ens2f0np0@lab-h1,,") == [
        DeviceEntry("mlx5_0", "ens1f0np0"),
        DeviceEntry("mlx5_1", "ens2f0np0", "lab-h1"),
    ]
    assert parse_list("") == []


def test_devices_of_a_list_may_share_a_netdev() -> None:
    """Two devices on lo fail over within one host; the same netdev in two namespaces is two NICs."""
    assert parse_list("mlx5_0=lo,mlx5_1=lo") == [DeviceEntry("mlx5_0", "lo"), DeviceEntry("mlx5_1", "lo")]
    assert [e.netns for e in parse_list("a=eth0@h0,b=eth0@h1")] == ["h0", "h1"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("mlx5_0", "SHIFT_TCP_DEVICES entry 'mlx5_0': expected name=netdev[@netns]"),
        ("=eth0", "SHIFT_TCP_DEVICES entry '=eth0': expected name=netdev[@netns]"),
        ("mlx5_0=", "SHIFT_TCP_DEVICES entry 'mlx5_0=': expected name=netdev[@netns]"),
        ("mlx5_0=@h0", "SHIFT_TCP_DEVICES entry 'mlx5_0=@h0': expected name=netdev[@netns]"),
        ("mlx5 0=eth0", "SHIFT_TCP_DEVICES entry 'mlx5 0=eth0': not a valid device name (1-64 letters"),
        (
            "mlx5_0=eth 0",
            "SHIFT_TCP_DEVICES entry 'mlx5_0=eth 0': 'eth 0' is not a valid network interface name",
        ),
        (
            "mlx5_0=name-far-too-long",
            "SHIFT_TCP_DEVICES entry 'mlx5_0=name-far-too-long': 'name-far-too-long' is",
        ),
        ("mlx5_0=eth0@", "SHIFT_TCP_DEVICES entry 'mlx5_0=eth0@': '' is not a valid network namespace name"),
        (
            "mlx5_0=eth0@a/b",
            "SHIFT_TCP_DEVICES entry 'mlx5_0=eth0@a/b': 'a/b' is not a valid network namespace",
        ),
        ("mlx5_0=eth0@h0@h1", "SHIFT_TCP_DEVICES entry 'mlx5_0=eth0@h0@h1': 'h0@h1' is not a valid network"),
        ("a=eth0,a=eth1", "SHIFT_TCP_DEVICES entry 'a=eth1': device 'a' is named twice"),
    ],
)
def test_a_bad_list_names_the_entry_and_the_rule(text: str, message: str) -> None:
    with pytest.raises(DeviceTableError) as info:
        parse_list(text)
    assert str(info.value).startswith(message)


# the two readers


def test_the_provider_reports_a_bad_list_as_a_verbs_error() -> None:
    with pytest.raises(
        VerbsError, match=r"^SHIFT_TCP_DEVICES entry 'mlx5_0': expected name=netdev\[@netns\]$"
    ):
        from_env("mlx5_0")
    assert [(d.name, d.netdev, d.netns) for d in from_env("a=lo@h0")] == [("a", "lo", "h0")]


def test_the_provider_reads_the_config_files_table(tmp_path: Path) -> None:
    path = tmp_path / "shiftd.toml"
    path.write_text('host = "h0"\n[devices]\nmlx5_0 = "ens1f0np0"\n')
    assert [(d.name, d.provider, d.netdev, d.netns) for d in from_config(path)] == [
        ("mlx5_0", "tcp", "ens1f0np0", None)
    ]
    assert from_config(tmp_path / "missing.toml") == []
    path.write_text('host = "h0"\n')
    assert from_config(path) == []


def test_the_env_wins_over_the_config_file(tmp_path: Path) -> None:
    path = tmp_path / "shiftd.toml"
    path.write_text('[devices]\nmlx5_0 = "ens1f0np0"\n')
    names = [d.name for d in load_devices({"SHIFT_TCP_DEVICES": "t0=lo", "SHIFT_CONFIG": str(path)})]
    assert names == ["t0"]
    assert [d.name for d in load_devices({"SHIFT_CONFIG": str(path)})] == ["mlx5_0"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[devices]\nmlx5_0 = "eth0"\nmlx5_1 = "eth0"', "devices.mlx5_1: netdev 'eth0' is already used"),
        ('[devices]\nmlx5_0 = "eth0@h0"', "devices.mlx5_0: 'eth0@h0' is not a valid network interface name"),
        ("devices = 3", 'devices: must be a table of device = "netdev"'),
    ],
)
def test_both_readers_give_a_bad_file_the_same_verdict(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "shiftd.toml"
    path.write_text(text)
    with pytest.raises(config.ConfigError) as daemon:
        config.load(path)
    with pytest.raises(VerbsError) as provider:
        from_config(path)
    assert str(daemon.value).startswith(f"{path}: {message}")
    assert str(provider.value) == str(daemon.value)


def test_the_provider_names_a_file_it_cannot_read(tmp_path: Path) -> None:
    path = tmp_path / "shiftd.toml"
    path.write_text("[devices\n")
    with pytest.raises(VerbsError, match=rf"^{path}: cannot read the device table: "):
        from_config(path)
