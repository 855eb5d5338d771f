"""Which NICs shiftd watches: RDMA ports found in sysfs, plus tcp devices from the config.

The sysfs layout is the one the kernel's ib_core exposes (see tests/fixtures/sysfs-*: RoCE, InfiniBand,
RoCE LAG):
class/infiniband/DEV/ports/N/{state,phys_state,link_layer,counters/link_downed} and the
port's netdev in gid_attrs/ndevs/* (RoCE) or, failing that, DEV/device/net/* (IPoIB).
The sysfs root is configurable so the same code reads a fixture tree in tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shiftd.config import Config
from shiftd.nic import NicSpec, PortStatus


class InventoryError(ValueError):
    """The NICs cannot be listed as configured; str() is the one line for the operator."""


@dataclass(frozen=True)
class RdmaPort:
    """One port of an RDMA device as sysfs shows it: for display and for the initial state."""

    device: str
    port: int
    netdev: str  # "" when the port has no network interface (InfiniBand without IPoIB)
    link_layer: str  # "Ethernet" (RoCE) or "InfiniBand"
    status: PortStatus


@dataclass(frozen=True)
class Inventory:
    nics: tuple[NicSpec, ...]
    rdma_ports: tuple[RdmaPort, ...]


def scan(config: Config) -> Inventory:
    """Every RDMA port under config.monitors.sysfs_root (only monitors.rdma_devices' when it names some),
    then the config's tcp devices."""
    ports = rdma_ports(Path(config.monitors.sysfs_root))
    found = {p.device for p in ports}
    if wanted := config.monitors.rdma_devices:
        if missing := [device for device in wanted if device not in found]:
            raise InventoryError(
                f"monitors.rdma_devices: no RDMA device {', '.join(missing)} in "
                f"{config.monitors.sysfs_root}/class/infiniband (found: {', '.join(sorted(found)) or 'none'})"
            )
        ports = [p for p in ports if p.device in wanted]
    for device in config.devices:
        if device in found:
            raise InventoryError(
                f"devices.{device}: a tcp device cannot take the name of the RDMA device {device} "
                "found in sysfs; choose another name"
            )
    nics = [NicSpec(p.device, p.netdev, "verbs", p.port) for p in ports]
    nics += [NicSpec(device, netdev, "tcp") for device, netdev in config.devices.items()]
    return Inventory(tuple(nics), tuple(ports))


def rdma_ports(sysfs_root: Path) -> list[RdmaPort]:
    """The ports of every device in class/infiniband, sorted by device and port."""
    ports: list[RdmaPort] = []
    for dev_dir in sorted((sysfs_root / "class" / "infiniband").glob("*")):
        for number in sorted(_numbered(dev_dir / "ports")):
            status = port_status(sysfs_root, dev_dir.name, number)
            if status is None:
                continue  # vanished while we looked
            link_layer = _read(dev_dir / "ports" / str(number) / "link_layer")
            ports.append(RdmaPort(dev_dir.name, number, _port_netdev(dev_dir, number), link_layer, status))
    return ports


def port_status(sysfs_root: Path, device: str, port: int) -> PortStatus | None:
    """The port's state now, or None when the port is not there (device removed)."""
    port_dir = sysfs_root / "class" / "infiniband" / device / "ports" / str(port)
    state = _read(port_dir / "state")
    if not state:
        return None
    downed = _read(port_dir / "counters" / "link_downed")
    return PortStatus(
        device=device,
        port=port,
        state=_label(state),
        phys_state=_label(_read(port_dir / "phys_state")),
        link_downed=int(downed) if downed.isdigit() else 0,
    )


# What an RDMA port counts of the packets it sent and of the retransmissions among them (the loss judge's
# evidence on an RNIC, whose traffic is not TCP): each retransmission event its driver counts (rxe's
# requester retries; mlx5's sequence-error NAKs received and local ack timeouts, each one resend), against
# the packets it sent (rxe's sent_pkts, or the port's PMA counter).
RETRANSMIT_COUNTERS = ("completer_retry_err", "packet_seq_err", "local_ack_timeout_err")
SENT_COUNTERS = (("hw_counters", "sent_pkts"), ("counters", "port_xmit_packets"))


def port_sent(sysfs_root: Path, device: str, port: int) -> tuple[int, int] | None:
    """(packets sent, retransmissions) the port has counted since the driver loaded; None when it counts
    either not at all (no hw_counters of a known driver, or the device is gone)."""
    port_dir = sysfs_root / "class" / "infiniband" / device / "ports" / str(port)
    resent = [_read(port_dir / "hw_counters" / name) for name in RETRANSMIT_COUNTERS]
    sent = [_read(port_dir / folder / name) for folder, name in SENT_COUNTERS]
    known_resent = [int(text) for text in resent if text.isdigit()]
    known_sent = [int(text) for text in sent if text.isdigit()]
    if not known_resent or not known_sent:
        return None
    return known_sent[0], sum(known_resent)


def _port_netdev(dev_dir: Path, port: int) -> str:
    """The GID table names the port's netdev (lowest index: the default GID; a bond for RoCE LAG, as
    mlx5_bond_0's GIDs name bond0); IPoIB has none there, so the PCI function's netdevs are next."""
    ndevs = dev_dir / "ports" / str(port) / "gid_attrs" / "ndevs"
    for index in sorted(_numbered(ndevs)):
        if name := _read(ndevs / str(index)):
            return name
    candidates = sorted((dev_dir / "device" / "net").glob("*"))
    for net in candidates:  # a multi-port function tells its netdevs apart by dev_port (0-based)
        if _read(net / "dev_port") == str(port - 1):
            return _upper(net)
    return _upper(candidates[0]) if candidates else ""


def _upper(net: Path) -> str:
    """A bonded netdev's traffic is the bond's (its `master` link): the bond is what carries the port."""
    master = net / "master"
    return master.resolve().name if master.is_symlink() else net.name


def _label(text: str) -> str:
    """sysfs writes states as "4: ACTIVE" / "5: LinkUp"; keep the word."""
    return text.partition(":")[2].strip() if ":" in text else text


def _numbered(directory: Path) -> list[int]:
    """The numeric entries of a directory (ports, GID indices); none when it is absent."""
    return [int(p.name) for p in directory.glob("*") if p.name.isdigit()]


def _read(path: Path) -> str:
    """A sysfs attribute's text, or "" when absent or unreadable (the kernel answers EINVAL for
    unused GID entries)."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""
