"""Inventory from fixture sysfs trees laid out as a ConnectX host lays them out."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from shiftd.config import Config, MonitorsConfig
from shiftd.inventory import InventoryError, RdmaPort, port_status, rdma_ports, scan
from shiftd.nic import NicSpec, PortStatus

FIXTURES = Path(__file__).parents[1] / "fixtures"
FIXTURE = FIXTURES / "sysfs"
ROCE, IB, BOND = (FIXTURES / f"sysfs-{kind}" for kind in ("roce", "ib", "bond"))
PORT_DIR = "class/infiniband/{}/ports/1"


def config(root: Path, devices: dict[str, str] | None = None) -> Config:
    return Config(devices=devices or {}, monitors=MonitorsConfig(sysfs_root=str(root)))


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    """A writable copy of the fixture tree, symlinks kept relative."""
    root = tmp_path / "sys"
    shutil.copytree(FIXTURE, root, symlinks=True)
    return root


def test_fixture_uses_relative_symlinks_like_sysfs() -> None:
    link = FIXTURE / "class" / "infiniband" / "mlx5_0"
    assert link.is_symlink() and not link.readlink().is_absolute()
    assert (link / "device" / "net" / "ens1f0np0").is_dir()


def test_rdma_ports_of_a_connectx_host() -> None:
    assert rdma_ports(FIXTURE) == [
        RdmaPort("mlx5_0", 1, "ens1f0np0", "Ethernet", PortStatus("mlx5_0", 1, "ACTIVE", "LinkUp", 0)),
        RdmaPort("mlx5_1", 1, "ens1f1np1", "Ethernet", PortStatus("mlx5_1", 1, "DOWN", "Disabled", 3)),
        RdmaPort("mlx5_2", 1, "ib0", "InfiniBand", PortStatus("mlx5_2", 1, "ACTIVE", "LinkUp", 1)),
    ]


def test_scan_lists_rdma_ports_then_config_devices() -> None:
    inventory = scan(config(FIXTURE, {"tcp0": "veth0", "tcp1": "veth1"}))
    assert inventory.nics == (
        NicSpec("mlx5_0", "ens1f0np0", "verbs", 1),
        NicSpec("mlx5_1", "ens1f1np1", "verbs", 1),
        NicSpec("mlx5_2", "ib0", "verbs", 1),
        NicSpec("tcp0", "veth0", "tcp", 1),
        NicSpec("tcp1", "veth1", "tcp", 1),
    )
    assert [p.device for p in inventory.rdma_ports] == ["mlx5_0", "mlx5_1", "mlx5_2"]


def test_config_device_named_like_an_rdma_device_is_a_clear_error() -> None:
    with pytest.raises(InventoryError) as info:
        scan(config(FIXTURE, {"mlx5_1": "veth0"}))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("devices.mlx5_1: ")
    assert "RDMA device mlx5_1" in message


def test_rdma_devices_keeps_only_the_hosts_own() -> None:
    """A lab holding several hosts' rxe devices on one kernel tells each shiftd which are its own."""
    own = Config(monitors=MonitorsConfig(sysfs_root=str(FIXTURE), rdma_devices=("mlx5_2", "mlx5_0")))
    assert [nic.device for nic in scan(own).nics] == ["mlx5_0", "mlx5_2"]
    assert [p.device for p in scan(own).rdma_ports] == ["mlx5_0", "mlx5_2"]


def test_rdma_devices_naming_an_absent_device_is_a_clear_error() -> None:
    absent = Config(monitors=MonitorsConfig(sysfs_root=str(FIXTURE), rdma_devices=("mlx5_0", "rxe7")))
    with pytest.raises(InventoryError) as info:
        scan(absent)
    assert str(info.value) == (
        f"monitors.rdma_devices: no RDMA device rxe7 in {FIXTURE}/class/infiniband"
        " (found: mlx5_0, mlx5_1, mlx5_2)"
    )


def test_no_rdma_hardware_means_config_devices_only(tmp_path: Path) -> None:
    inventory = scan(config(tmp_path, {"tcp0": "veth0"}))
    assert inventory.nics == (NicSpec("tcp0", "veth0", "tcp"),)
    assert inventory.rdma_ports == ()


def test_default_gid_names_the_netdev_not_a_vlan_entry(sysfs: Path) -> None:
    ndevs = sysfs / PORT_DIR.format("mlx5_0") / "gid_attrs" / "ndevs"
    (ndevs / "0").write_text("")  # an unused GID entry (the kernel answers EINVAL)
    (ndevs / "1").write_text("")
    assert rdma_ports(sysfs)[0].netdev == "ens1f0np0.100"
    shutil.rmtree(ndevs)
    assert rdma_ports(sysfs)[0].netdev == "ens1f0np0"  # from device/net


def test_multi_port_function_matches_netdev_by_dev_port(sysfs: Path) -> None:
    dev = sysfs / "class" / "infiniband" / "mlx5_2"
    shutil.copytree(dev / "ports" / "1", dev / "ports" / "2")
    (dev / "ports" / "2" / "state").write_text("2: INIT\n")
    second = dev / "device" / "net" / "ib1"
    second.mkdir()
    (second / "dev_port").write_text("1\n")
    ports = [p for p in rdma_ports(sysfs) if p.device == "mlx5_2"]
    assert [(p.port, p.netdev, p.status.state) for p in ports] == [(1, "ib0", "ACTIVE"), (2, "ib1", "INIT")]


def test_port_status_reads_state_words_and_tolerates_missing_counters(sysfs: Path) -> None:
    port = sysfs / PORT_DIR.format("mlx5_0")
    (port / "state").write_text("3: ARMED\n")
    (port / "counters" / "link_downed").unlink()
    assert port_status(sysfs, "mlx5_0", 1) == PortStatus("mlx5_0", 1, "ARMED", "LinkUp", 0)
    assert port_status(sysfs, "mlx5_0", 2) is None
    assert port_status(sysfs, "mlx5_9", 1) is None


def test_connectx_roce_host_one_port_per_function() -> None:
    """A ConnectX-6 Dx pair as a rail-optimized GPU host has it: mlx5_0 and mlx5_1, one port each, the
    netdev from the default GID (not the VLAN's GIDs that follow it)."""
    assert rdma_ports(ROCE) == [
        RdmaPort("mlx5_0", 1, "ens1f0np0", "Ethernet", PortStatus("mlx5_0", 1, "ACTIVE", "LinkUp", 0)),
        RdmaPort("mlx5_1", 1, "ens1f1np1", "Ethernet", PortStatus("mlx5_1", 1, "ACTIVE", "LinkUp", 2)),
    ]
    assert [n.device for n in scan(config(ROCE)).nics] == ["mlx5_0", "mlx5_1"]


def test_infiniband_host_uses_the_ipoib_netdev_and_keeps_port_states() -> None:
    assert rdma_ports(IB) == [
        RdmaPort("mlx5_0", 1, "ibp23s0", "InfiniBand", PortStatus("mlx5_0", 1, "ACTIVE", "LinkUp", 0)),
        RdmaPort("mlx5_1", 1, "ibp24s0", "InfiniBand", PortStatus("mlx5_1", 1, "INIT", "LinkUp", 1)),
    ]


def test_roce_lag_is_one_device_on_the_bond(tmp_path: Path) -> None:
    assert rdma_ports(BOND) == [
        RdmaPort("mlx5_bond_0", 1, "bond0", "Ethernet", PortStatus("mlx5_bond_0", 1, "ACTIVE", "LinkUp", 0)),
    ]
    root = tmp_path / "sys"
    shutil.copytree(BOND, root, symlinks=True)
    shutil.rmtree(root / PORT_DIR.format("mlx5_bond_0") / "gid_attrs" / "ndevs")
    # without GIDs naming it, the bond is still found: the function's netdev is a member of bond0
    assert rdma_ports(root)[0].netdev == "bond0"


def test_system_device_names_are_kept() -> None:
    """Names are the kernel's (mlx5_0, mlx5_bond_0), so `shiftctl fail-nic mlx5_0` names a real NIC."""
    names = {p.device for tree in (ROCE, IB, BOND) for p in rdma_ports(tree)}
    assert names == {"mlx5_0", "mlx5_1", "mlx5_bond_0"}
