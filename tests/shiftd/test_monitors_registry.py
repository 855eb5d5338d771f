"""shiftd.monitors: monitors register themselves by name; the daemon builds what the config turns on."""

from pathlib import Path

import pytest

from shiftd import monitors
from shiftd.config import MonitorsConfig
from shiftd.monitors.netlink import NetlinkMonitor
from shiftd.monitors.rdma_sysfs import RdmaSysfsMonitor
from shiftd.monitors.tcp_loss import TcpLossMonitor
from shiftd.monitors.udev import UdevMonitor
from shiftd.nic import NicSpec
from shiftd.nics import NicTable

SYSFS = Path(__file__).parents[1] / "fixtures" / "sysfs"


def nic_table() -> NicTable:
    specs = [NicSpec("mlx5_0", "ens1f0np0", "verbs", 1), NicSpec("tcp0", "lo", "tcp")]
    return NicTable(specs, 2.0, lambda record, transition: None, lambda: None)


def test_the_registry_holds_exactly_the_four_monitors() -> None:
    assert monitors.names() == ["netlink", "rdma_sysfs", "tcp_loss", "udev"]


def test_an_unknown_name_is_a_clear_error() -> None:
    with pytest.raises(
        monitors.UnknownMonitor,
        match=r"no monitor named 'inotify' \(known: netlink, rdma_sysfs, tcp_loss, udev\)",
    ):
        monitors.factory("inotify")


def test_a_name_registers_once() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        monitors.register("netlink")(lambda config, nics: None)


def test_build_makes_each_monitor_the_config_turns_on() -> None:
    built = monitors.build(MonitorsConfig(sysfs_root=str(SYSFS)), nic_table())
    assert {name: type(monitor) for name, monitor in built.items()} == {
        "netlink": NetlinkMonitor,
        "rdma_sysfs": RdmaSysfsMonitor,
        "tcp_loss": TcpLossMonitor,
        "udev": UdevMonitor,
    }
    assert built["netlink"].netdevs == {"ens1f0np0", "lo"}
    assert built["rdma_sysfs"].ports == (("mlx5_0", 1),)  # tcp devices have no port to poll
    assert built["tcp_loss"].interval == MonitorsConfig().tcp_loss_poll_seconds


def test_build_leaves_out_what_the_config_turns_off() -> None:
    off = MonitorsConfig(netlink=False, udev=False, rdma_sysfs=False, tcp_loss=False)
    assert monitors.build(off, nic_table()) == {}


def test_rdma_sysfs_is_off_without_verbs_devices() -> None:
    tcp_only = NicTable([NicSpec("tcp0", "lo", "tcp")], 2.0, lambda record, transition: None, lambda: None)
    assert set(monitors.build(MonitorsConfig(), tcp_only)) == {"netlink", "tcp_loss", "udev"}
