"""Inside the guest: two veth pairs with an rxe device on each of the four ends.

Pair p joins veth{2p} (10.0.p.1) and veth{2p+1} (10.0.p.2); rxe{n} runs on veth{n}. So rxe0-rxe1 and
rxe2-rxe3 are two links, and the even devices are one "host"'s NICs, the odd ones the other's: each side has
a backup on a link of its own (taking one end of a pair down takes its peer's carrier too).

All four ends live in the guest's one network namespace: rdma_rxe in Debian 12's kernel (6.1) opens its UDP
socket in the initial namespace only, so rxe on a veth moved into another namespace sends nothing. Both
addresses of a pair are then local to one kernel, which would answer them on lo; policy routing sends a
packet from one end to the other through the veth instead (a rule per direction, looked up before the
local table), with accept_local and no rp_filter so that the receiving end takes it. Taking a veth down
flushes its routes and neighbours, so `RouteKeeper` puts them back once the link is up again. Meanwhile a
blackhole route in each end's table (behind the veth's) keeps its packets from falling through to the
local table, where lo would deliver them: a link taken down must carry nothing, as a cable pulled.
"""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

PAIRS = 2
TABLE_BASE = 100  # routing table of end n: TABLE_BASE + n
BLACKHOLE_METRIC = 1000  # behind the veth's route (metric 0), which wins while it is there
SYSFS_IB = Path("/sys/class/infiniband")
BATCH = {"ip": ("-force", "-batch"), "rdma": ("-f", "-b")}  # each tool spells it its own way


@dataclass(frozen=True)
class End:
    index: int  # n: veth{n}, rxe{n}

    @property
    def netdev(self) -> str:
        return f"veth{self.index}"

    @property
    def device(self) -> str:
        return f"rxe{self.index}"

    @property
    def address(self) -> str:
        return f"10.0.{self.index // 2}.{self.index % 2 + 1}"

    @property
    def peer(self) -> End:
        return End(self.index ^ 1)

    @property
    def table(self) -> int:
        return TABLE_BASE + self.index


ENDS = tuple(End(n) for n in range(2 * PAIRS))
DEVICES = tuple(end.device for end in ENDS)


def sh(*argv: str, check: bool = True) -> str:
    result = subprocess.run(argv, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {result.stderr.strip() or result.returncode}")
    return result.stdout


def sysctl(key: str, value: str) -> None:
    Path("/proc/sys", *key.split(".")).write_text(value)


def setup(timeout: float = 60.0) -> None:
    """Build the pairs, the routing and the rxe devices; return once every port is ACTIVE with a GID."""
    sh("modprobe", "-a", "veth", "rdma_rxe", "ib_uverbs")
    commands = ["link set lo up"]  # one ip(8) for all: a process costs a good part of a second under TCG
    commands += [f"link add {end.netdev} type veth peer name {end.peer.netdev}" for end in ENDS[::2]]
    for end in ENDS:
        commands += [f"addr add {end.address}/24 dev {end.netdev}", f"link set {end.netdev} up"]
        rule = f"from {end.address} to {end.peer.address} lookup {end.table}"
        commands.append(f"rule add pref {10 + end.index} iif lo {rule}")
        commands.append(f"route add blackhole {end.peer.address} table {end.table} metric {BLACKHOLE_METRIC}")
    # the local table after those rules, not before (pref 0) where it would answer every local address
    commands += ["rule add pref 100 lookup local", "rule del pref 0"]
    batch("ip", commands)
    for conf in ("all", "default", *(end.netdev for end in ENDS)):
        sysctl(f"net.ipv4.conf.{conf}.accept_local", "1")
        sysctl(f"net.ipv4.conf.{conf}.rp_filter", "0")
    repair()
    batch("rdma", [f"link add {end.device} type rxe netdev {end.netdev}" for end in ENDS])
    deadline = time.monotonic() + timeout
    while not all(_ready(end.device) for end in ENDS):
        if time.monotonic() > deadline:
            raise RuntimeError(f"rxe ports not ACTIVE after {timeout:.0f} s: {sh('rdma', 'link', 'show')}")
        time.sleep(0.2)


def batch(tool: str, commands: list[str], check: bool = True) -> None:
    """Several ip(8) or rdma(8) commands in one process (all of them, even after a failure)."""
    result = subprocess.run(
        [tool, *BATCH[tool], "-"], input="\n".join(commands) + "\n", capture_output=True, text=True
    )
    if check and result.returncode != 0:
        raise RuntimeError(f"{tool} -batch: {result.stderr.strip() or result.returncode}")


def _ready(device: str) -> bool:
    port = SYSFS_IB / device / "ports" / "1"
    try:
        state = (port / "state").read_text()
        gids = [(port / "gids" / str(i)).read_text().strip() for i in range(2)]
    except OSError:
        return False
    return "ACTIVE" in state and all(gid.strip(":0") for gid in gids)


def repair() -> None:
    """Each end's route to its peer through its own veth, and the peer's MAC (no ARP between local
    addresses); both fail harmlessly while the link is down."""
    commands = []
    for end in ENDS:
        peer_mac = Path(f"/sys/class/net/{end.peer.netdev}/address").read_text().strip()
        commands += [
            f"route replace {end.peer.address} dev {end.netdev} src {end.address} table {end.table}",
            f"neigh replace {end.peer.address} lladdr {peer_mac} dev {end.netdev} nud permanent",
        ]
    batch("ip", commands, check=False)


class RouteKeeper(threading.Thread):
    """Puts the routes back after a link fault flushed them (a test took a veth down and up)."""

    def __init__(self, period: float = 0.5) -> None:
        super().__init__(name="route-keeper", daemon=True)
        self._period = period
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self._period):
            present = sh("ip", "route", "show", "table", "all", check=False)
            if any(f"dev {end.netdev} table {end.table}" not in present for end in ENDS):
                repair()

    def stop(self) -> None:
        self._halt.set()
        self.join()
