"""The tcp provider against the machine's own TCP: shift-perf server and client on two namespaces.

Builds two network namespaces joined by a veth pair (prefix `lt`), runs `shift-perf` as a server in one and
as a client in the other for write_bw, send_bw, read_bw (64 KiB and 1 MiB) and send_lat (8 B), and prints one
table in which every row carries its ratio to a raw TCP stream / raw TCP ping-pong over the same veth,
measured in the same run by shift-perf in C (libshift/core/baseline.c). Targets: WRITE and SEND at 1 MiB
>= 0.8 of the raw stream; 8-byte SEND latency <= 2x the raw ping-pong half round trip. shift-perf waits on
the completion channel (its default); the machine's other load counts, so compare ratios of one run.

The peers' own tools run on the same veth in the same run, before and after shift-perf (bench/peer_tools.py):
`qperf tcp_lat` (8 B), `qperf tcp_bw` and `iperf3`'s single stream (1 MiB writes). A second table gives
shift's figures as ratios to the better of the two measurements of each, with the native data path's
targets: 8 B SEND half round trip <= 1.5x qperf tcp_lat, 1 MiB RDMA_WRITE >= 0.8x iperf3.

    sudo .venv/bin/python bench/perf_tcp_provider.py [--peer-seconds 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from peer_tools import Peers, PeerToolError, measure

from libshift.perf import Row, table
from shiftlab.veth import VethPair

RUNS = [("write_bw", 65536), ("write_bw", 1 << 20), ("send_bw", 65536), ("send_bw", 1 << 20)]
RUNS += [("read_bw", 65536), ("read_bw", 1 << 20), ("send_lat", 8)]
TARGETS = {
    ("write_bw", 1 << 20): (">=", 0.8),
    ("send_bw", 1 << 20): (">=", 0.8),
    ("send_lat", 8): ("<=", 2.0),
}
# shift's row, the peer's figure it is divided by (the better of its runs: a figure of the peer at its best),
# and the target of the ratio
Best = Callable[[list[Peers]], float]
PEER_RATIOS: list[tuple[tuple[str, int], str, Best, tuple[str, float] | None]] = [
    (("send_lat", 8), "qperf tcp_lat", lambda runs: min(p.tcp_lat for p in runs), ("<=", 1.5)),
    (("write_bw", 1 << 20), "iperf3 one stream", lambda runs: max(p.iperf3 for p in runs), (">=", 0.8)),
    (("write_bw", 1 << 20), "qperf tcp_bw", lambda runs: max(p.tcp_bw for p in runs), None),
]
OUT = Path(__file__).with_name("out")


def perf(env: dict[str, str], test: str, size: int, device: str, server: str | None) -> list[str]:
    argv = [sys.executable, "-m", "libshift.perf", test, "-d", device, "-s", str(size), "--json"]
    return argv + ([server] if server else [])


def one(fabric: VethPair, env: dict[str, str], test: str, size: int) -> Row:
    server = subprocess.Popen(
        perf(env, test, size, "lt_srv", None), env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        server.stdout.readline()  # "waiting on ...": the server listens
        client = subprocess.run(
            perf(env, test, size, "lt_cli", fabric.hosts[1].address),
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if client.returncode != 0:
            raise SystemExit(f"perf_tcp_provider: {test} {size}: {client.stderr.strip()}")
        (row,) = json.loads(client.stdout)
        return Row(**row)
    finally:
        server.wait(timeout=60)


def verdict(ratio: float, target: tuple[str, float] | None) -> str:
    if target is None:
        return ""
    sign, bound = target
    met = ratio >= bound if sign == ">=" else ratio <= bound
    return f"target {sign} {bound}: {'met' if met else 'MISSED'}"


@dataclass(frozen=True)
class PeerRatio:
    """One of shift's figures over a peer tool's on the same link."""

    test: str
    size: int
    value: float
    peer: str
    peer_value: float
    ratio: float
    target: tuple[str, float] | None


def peer_ratios(rows: list[Row], peers: list[Peers]) -> list[PeerRatio]:
    mine = {(r.test, r.size): r for r in rows}
    made = []
    for (test, size), peer, best, target in PEER_RATIOS:
        value, theirs = mine[(test, size)].value, best(peers)
        made.append(PeerRatio(test, size, value, peer, theirs, value / theirs, target))
    return made


def figure(value: float, test: str) -> str:
    """A bandwidth (a test named *_bw) in MB/s, a latency (*_lat) in us."""
    return f"{value / 1e6:9.1f} MB/s" if test.endswith("_bw") else f"{value * 1e6:11.1f} us"


def print_tables(rows: list[Row], peers: list[Peers], ratios: list[PeerRatio]) -> None:
    lines = table(rows).splitlines()
    print(lines[0])
    for line, row in zip(lines[1:], rows, strict=True):
        print(f"{line}   {verdict(row.ratio, TARGETS.get((row.test, row.size)))}")
    first = peers[0]
    print("\npeers' tools on the same veth, before / after shift-perf:")
    for label, test, values in [
        (f"qperf tcp_lat {first.lat_size} B", "tcp_lat", [p.tcp_lat for p in peers]),
        (f"qperf tcp_bw {first.bw_size} B", "tcp_bw", [p.tcp_bw for p in peers]),
        (f"iperf3 one stream {first.bw_size} B", "tcp_bw", [p.iperf3 for p in peers]),
    ]:
        print(f"  {label:<28} {' / '.join(figure(v, test).strip() for v in values)}")
    print(f"\n{'test':<10} {'bytes':>9} {'shift':>14}   {'peer (best run)':<18} {'peer':>14} {'ratio':>6}")
    for r in ratios:
        print(
            f"{r.test:<10} {r.size:>9} {figure(r.value, r.test):>14}   {r.peer:<18} "
            f"{figure(r.peer_value, r.test):>14} {r.ratio:6.2f}   {verdict(r.ratio, r.target)}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer-seconds", type=float, default=2.0, help="length of each peer tool's test")
    parser.add_argument("--json", type=Path, default=OUT / "perf_tcp_provider.json", help="where results go")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("perf_tcp_provider: needs root (network namespaces)", file=sys.stderr)
        return 1
    with VethPair("lt", "198.18.97") as fabric:
        env = dict(os.environ, SHIFT_TCP_DEVICES=fabric.tcp_devices("lt_cli", "lt_srv"))
        try:
            peers = [measure(*fabric.hosts, seconds=args.peer_seconds)]
            rows = []
            for test, size in RUNS:
                rows.append(one(fabric, env, test, size))
                time.sleep(0.2)  # let the server's port go
            peers.append(measure(*fabric.hosts, seconds=args.peer_seconds))
        except PeerToolError as exc:
            raise SystemExit(f"perf_tcp_provider: {exc}") from None
    ratios = peer_ratios(rows, peers)
    print_tables(rows, peers, ratios)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    results = {
        "rows": [asdict(r) for r in rows],
        "peers": [asdict(p) for p in peers],
        "peer_ratios": [asdict(r) for r in ratios],
    }
    args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
