"""A lab on Soft-RoCE (`shift-lab up --provider rxe`): an rxe device on every host NIC, and the routing that
makes NICs of several hosts in one kernel talk through their cables.

rdma_rxe in Debian 12's kernel (6.1) opens its UDP socket in the initial network namespace only, so rxe on a
netdev moved into another namespace sends nothing. The hosts' NICs therefore stay in the initial namespace,
cabled to the same rail switches as in the tcp lab (shiftlab.fabric), so a fault on a rail and `shiftctl
fail-nic` act as there. Every host's addresses are then local to one kernel, which would deliver a packet
between two of them on lo: a rule per NIC, looked up before the local table, sends what leaves a NIC's
address through that NIC (a routing table of its own); permanent neighbours stand in for ARP between local
addresses, and accept_local with no rp_filter let the receiving NIC take the packet (as the VM's own fabric
does, shiftlab/rxe/network.py). Taking a NIC down flushes its table and neighbours; the route keeper
(shiftlab.routekeeper) puts them back once it is up again. Meanwhile a blackhole route in each NIC's table,
behind its own, keeps the NIC's packets from falling through to the local table, where lo would deliver
them: a NIC taken down carries nothing, as on a real host.

What `build` changes beyond the lab's own netdevs (the local rule's place, all.rp_filter) is written to a
record first, so that `destroy` puts the machine's routing back as it was, even after a failed build.
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from pyroute2 import IPRoute

from shiftlab.fabric import MAX_HOSTS, MAX_NICS, PREFIXLEN, FabricError, Shape, nic_mac
from shiftlab.rxe.network import BLACKHOLE_METRIC, SYSFS_IB

RULE_PREF = 20  # the lab's rules: after those of shiftlab/rxe/network.py (10-13), before the local table
LOCAL_PREF = 100  # where the local table's rule moves to (network.py moves it there too)
TABLE_BASE = 21000  # routing table of host i's NIC r: TABLE_BASE + MAX_NICS * i + r
TABLES = range(TABLE_BASE, TABLE_BASE + MAX_HOSTS * MAX_NICS)
MODULES = ("rdma_rxe", "ib_uverbs")  # the device, and the /dev/infiniband files libibverbs opens
NIC_SYSCTLS = {"accept_local": "1", "rp_filter": "0", "arp_ignore": "1", "arp_announce": "2"}
MGMT_SYSCTLS = {"arp_ignore": "1", "arp_announce": "2"}  # several hosts' ends on one subnet: answer for own
RP_FILTER_ALL = Path("/proc/sys/net/ipv4/conf/all/rp_filter")  # counts as the max with each netdev's
LOCAL_TABLE = 255
READY_TIMEOUT = 60.0
BATCH = {"ip": ("-force", "-batch", "-"), "rdma": ("-f", "-b", "-")}  # each tool spells it its own way


class SoftRoceError(FabricError):
    """The kernel or the tools cannot give the lab rxe devices; str() is one line for the operator."""


@dataclass
class Record:
    """What the lab changed in the machine's own routing, for `destroy` to undo."""

    devices: list[str]
    local_rule_moved: bool = False
    rp_filter_all: str | None = None  # the value all.rp_filter had before the lab set it to 0

    @classmethod
    def load(cls, path: Path) -> Record | None:
        try:
            return cls(**json.loads(path.read_text()))
        except FileNotFoundError:
            return None

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)) + "\n")


def require() -> None:
    """The rdma tool and a kernel that loads rdma_rxe, or one line saying which is missing."""
    if shutil.which("rdma") is None:
        raise SoftRoceError(
            "--provider rxe needs the rdma tool, which is not installed (apt-get install iproute2)"
        )
    for module in MODULES:
        result = subprocess.run(["modprobe", module], capture_output=True, text=True)
        if result.returncode != 0:
            why = (result.stderr.strip() or f"modprobe: status {result.returncode}").splitlines()[0]
            raise SoftRoceError(
                f"--provider rxe: this kernel cannot load {module} ({why}); use --provider tcp"
            )


def table(i: int, r: int) -> int:
    return TABLE_BASE + MAX_NICS * i + r


def build(shape: Shape, record_path: Path) -> None:
    """Routing, sysctls and rxe devices on the NICs that shiftlab.fabric made; returns once every port is
    ACTIVE with its IPv4 GID. Repeatable: a second build of the same lab changes nothing."""
    route(shape, record_path)
    present = {p.name for p in SYSFS_IB.glob("*")}
    links = [
        f"link add {device} type rxe netdev {netdev}"
        for i in range(shape.hosts)
        for device, netdev in shape.host_devices(i).items()
        if device not in present
    ]
    if links:
        batch("rdma", links)
    _wait_ready(shape)


def route(shape: Shape, record_path: Path) -> None:
    """The sysctls, rules, tables and neighbours that send each NIC's packets through its cable."""
    devices = [device for i in range(shape.hosts) for device in shape.host_devices(i)]
    record = Record.load(record_path) or Record(devices)
    record.save(record_path)
    for i in range(shape.hosts):
        for netdev in shape.host_devices(i).values():
            _write_sysctls(netdev, NIC_SYSCTLS)
        _write_sysctls(shape.mgmt_netdev(i), MGMT_SYSCTLS)
    rp_filter = RP_FILTER_ALL.read_text().strip()
    if rp_filter != "0":
        record.rp_filter_all = record.rp_filter_all or rp_filter
        record.save(record_path)
        RP_FILTER_ALL.write_text("0")
    commands = [f"rule del {rule}" for rule in _rules()]  # a rebuild adds them afresh
    for i in range(shape.hosts):
        for r in range(shape.nics):
            address, subnet = shape.rail_address(r, i), _subnet(shape, r)
            commands += [
                f"rule add pref {RULE_PREF} iif lo from {address} to {subnet} lookup {table(i, r)}",
                f"route replace blackhole {subnet} table {table(i, r)} metric {BLACKHOLE_METRIC}",
            ]
    if _local_rule_prefs() == [0]:  # the local table must come after the lab's rules, not before them
        record.local_rule_moved = True
        record.save(record_path)
        commands += [f"rule add pref {LOCAL_PREF} lookup local", "rule del pref 0 lookup local"]
    batch("ip", commands + repair_commands(shape, _nics(shape)))


def repair_commands(shape: Shape, nics: list[tuple[int, int]]) -> list[str]:
    """ip(8) commands for NIC (i, r)'s route through itself and its rail peers' MACs (no ARP between local
    addresses); both fail harmlessly while the NIC is down."""
    commands = []
    for i, r in nics:
        netdev, address = shape.nic_netdev(i, r), shape.rail_address(r, i)
        commands.append(f"route replace {_subnet(shape, r)} dev {netdev} src {address} table {table(i, r)}")
        commands += [
            f"neigh replace {shape.rail_address(r, j)} lladdr {nic_mac(r, j)} dev {netdev} nud permanent"
            for j in range(shape.hosts)
            if j != i
        ]
    return commands


def destroy(record_path: Path) -> list[str]:
    """Delete the lab's rxe devices and rules and put back what `build` changed; says what it did. The NICs
    themselves go with the fabric (their peers are in the rail namespaces)."""
    record = Record.load(record_path)
    if record is None:
        return []
    done = []
    present = [device for device in record.devices if (SYSFS_IB / device).exists()]
    if present:
        batch("rdma", [f"link delete {device}" for device in present], check=False)
        done.append(f"removed rxe devices {', '.join(present)}")
    rules = _rules()
    commands = [f"rule del {rule}" for rule in rules]
    if rules:
        done.append(f"removed {len(rules)} policy routing rules")
    tables = _tables()  # the blackholes: the NICs' own routes go with the NICs
    commands += [f"route flush table {number}" for number in tables]
    if tables:
        done.append(f"flushed {len(tables)} routing tables")
    if record.local_rule_moved and 0 not in _local_rule_prefs():
        commands += ["rule add pref 0 lookup local", f"rule del pref {LOCAL_PREF} lookup local"]
        done.append("moved the local table's rule back to pref 0")
    if commands:
        batch("ip", commands, check=False)
    if record.rp_filter_all is not None:
        RP_FILTER_ALL.write_text(record.rp_filter_all)
        done.append(f"set net.ipv4.conf.all.rp_filter back to {record.rp_filter_all}")
    record_path.unlink()
    return done


def batch(tool: str, commands: list[str], check: bool = True) -> None:
    """Several ip(8) or rdma(8) commands in one process (a process costs a good part of a second in a VM)."""
    result = subprocess.run(
        [tool, *BATCH[tool]], input="\n".join(commands) + "\n", capture_output=True, text=True
    )
    if check and result.returncode != 0:
        raise SoftRoceError(
            f"{tool} -batch: {(result.stderr.strip() or str(result.returncode)).splitlines()[0]}"
        )


def _device(shape: Shape, i: int, r: int) -> str:
    return list(shape.host_devices(i))[r]


def _subnet(shape: Shape, r: int) -> str:
    return str(ipaddress.ip_network(f"{shape.rail_address(r, 0)}/{PREFIXLEN}", strict=False))


def _nics(shape: Shape) -> list[tuple[int, int]]:
    return [(i, r) for i in range(shape.hosts) for r in range(shape.nics)]


def _write_sysctls(netdev: str, values: dict[str, str]) -> None:
    for key, value in values.items():
        Path(f"/proc/sys/net/ipv4/conf/{netdev}/{key}").write_text(value)


def _rules() -> list[str]:
    """The lab's rules now in the kernel, as `ip rule del` arguments."""
    return [f"pref {pref} lookup {number}" for pref, number in _ipv4_rules() if number in TABLES]


def _tables() -> list[int]:
    """The lab's routing tables that hold a route now."""
    with IPRoute() as ipr:
        return sorted(
            {n for route in ipr.route("dump", family=socket.AF_INET) if (n := route.get("table")) in TABLES}
        )


def _local_rule_prefs() -> list[int]:
    """The prefs of the rules that look up the local table (0 on a machine nobody changed)."""
    return [pref for pref, number in _ipv4_rules() if number == LOCAL_TABLE]


def _ipv4_rules() -> list[tuple[int, int]]:
    """(pref, table) of every IPv4 rule."""
    with IPRoute() as ipr:
        return [
            (rule.get("priority") or 0, rule.get("table")) for rule in ipr.get_rules(family=socket.AF_INET)
        ]


def _wait_ready(shape: Shape) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    waiting = _nics(shape)
    while waiting := [(i, r) for i, r in waiting if not _ready(shape, i, r)]:
        if time.monotonic() > deadline:
            names = ", ".join(_device(shape, i, r) for i, r in waiting)
            raise SoftRoceError(
                f"rxe ports not ACTIVE with their IPv4 GID after {READY_TIMEOUT:.0f} s: {names}"
            )
        time.sleep(0.2)


def _ready(shape: Shape, i: int, r: int) -> bool:
    """Port 1 ACTIVE and the NIC's IPv4 address in its GID table (the GID libshift addresses it by)."""
    port = SYSFS_IB / _device(shape, i, r) / "ports" / "1"
    gid = ipaddress.IPv6Address(f"::ffff:{shape.rail_address(r, i)}").exploded
    try:
        if "ACTIVE" not in (port / "state").read_text():
            return False
        gids = [path.read_text().strip() for path in (port / "gids").iterdir()]
    except OSError:
        return False
    return gid in gids
