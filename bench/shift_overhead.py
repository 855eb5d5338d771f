"""Overhead of a shift QP over a bare tcp-provider QP: bandwidth and small-message latency, in one run.

On a 2x2 lab, h0 and h1 run the same stream program (failover_peer.py) over mlx5_0, once with the bare
provider's objects (Context/PD/MR/CQ/QP) and once with the shift objects (backup QP on mlx5_1, ledger,
shiftd registration), alternating plain and shift in every round so that both see the same machine:
  - bandwidth: RDMA_WRITE of --bw-size bytes, 16 outstanding, every 16th signaled (perftest's pattern),
    for --seconds; bytes completed / time;
  - latency: 8-byte SEND ping-pong, busy polling on both sides; the median half round trip.
The ratio of each is shift / plain from the medians over rounds. Targets: bandwidth >= 0.97, latency <= 1.05.
A last line gives the peers' tools on the same link (bench/peer_tools.py): qperf tcp_lat and iperf3's stream.

    sudo .venv/bin/python bench/shift_overhead.py [--rounds 3] [--seconds 2] [--pings 2000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import asdict

import peer_tools
from failover_lab import Pair, arguments, lab_for, progress, save
from peer_tools import Peers, PeerToolError, lab_end

from shiftlab.lab import Lab

STACKS = ("plain", "shift")
TARGETS = {"bandwidth": (">=", 0.97), "latency": ("<=", 1.05)}


def pairs(lab: Lab, args: argparse.Namespace) -> dict[tuple[str, str], Pair]:
    """A connected pair per metric and stack; idle pairs block, so they do not load the measured one."""
    wait = ["--block"] if not args.busy else ["--spin"]
    bw = ["--mode", "write", "--size", str(args.bw_size), "--signal-every", "16"]
    lat = ["--mode", "send", "--size", "8"]
    made: dict[tuple[str, str], Pair] = {}
    for stack in STACKS:
        plain = ["--plain"] if stack == "plain" else []
        made[("bandwidth", stack)] = Pair(lab, *bw, *plain, *wait)
        made[("latency", stack)] = Pair(lab, *lat, *plain, *wait)
    return made


def measure(pair: Pair, metric: str, args: argparse.Namespace) -> float:
    """Bytes a second of one burst of RDMA_WRITEs, or the median half round trip (s) of 8-byte pings."""
    if metric == "bandwidth":
        answer = pair.sender.ask("burst", burst=args.seconds)
        value = answer["burst"] / answer["seconds"]
    else:
        answer = pair.sender.ask("ping", ping=args.pings)
        value = statistics.median(answer["ping"])
    if answer["errors"]:
        raise SystemExit(f"{metric}: {answer['errors']}")
    return value


def verdict(metric: str, ratio: float) -> str:
    sign, bound = TARGETS[metric]
    met = ratio >= bound if sign == ">=" else ratio <= bound
    return f"{sign} {bound}: {'met' if met else 'MISSED'}"


def main() -> int:
    parser = arguments(__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="plain/shift alternations (default 10)")
    parser.add_argument("--seconds", type=float, default=0.5, help="length of each bandwidth burst")
    parser.add_argument("--bw-size", type=int, default=1 << 20, help="bytes per RDMA_WRITE (default 1 MiB)")
    parser.add_argument("--pings", type=int, default=300, help="ping-pongs per latency measurement")
    parser.add_argument(
        "--busy", action="store_true", help="busy-poll the CQs (the peers spin) instead of blocking"
    )
    args = parser.parse_args()
    runs: dict[str, dict[str, list[float]]] = {m: {s: [] for s in STACKS} for m in TARGETS}
    with lab_for(args) as lab:
        progress("connecting the pairs...")
        made = pairs(lab, args)
        try:
            for (metric, _), pair in made.items():  # warm-up: first frames, caches, lookups
                measure(pair, metric, argparse.Namespace(**{**vars(args), "seconds": 0.1, "pings": 50}))
            for r in range(args.rounds):
                progress(f"round {r + 1}/{args.rounds}")
                for metric in TARGETS:
                    for stack in STACKS if r % 2 == 0 else STACKS[::-1]:
                        runs[metric][stack].append(measure(made[(metric, stack)], metric, args))
            for pair in made.values():
                pair.stop()
            progress("qperf and iperf3 on the same link...")
            peers = peer_tools.measure(lab_end(lab, "h0"), lab_end(lab, "h1"), bw_size=args.bw_size)
        except PeerToolError as exc:
            raise SystemExit(f"shift_overhead: {exc}") from None
        finally:
            for pair in made.values():
                pair.kill()
    print(file=sys.stderr)
    print_table(runs, args, peers)
    save(args, {"bw_size": args.bw_size, "busy": args.busy, "runs": runs, "peers": asdict(peers)})
    return 0


def print_table(runs: dict[str, dict[str, list[float]]], args: argparse.Namespace, peers: Peers) -> None:
    waits = "busy polling" if args.busy else "blocking on completion channels"
    print(
        f"\nshift QP against bare tcp-provider QP, mlx5_0 h0 -> h1, {waits}, {args.rounds} alternating rounds"
    )
    print("(medians over rounds; the ratio is shift / plain)\n")
    header = f"{'metric':34} {'plain':>10} {'shift':>10} {'ratio':>7}   {'rounds':14} target"
    print(header)
    print("-" * len(header))
    labels = {
        "bandwidth": (f"RDMA_WRITE {args.bw_size} B bandwidth (MB/s)", 1e-6),
        "latency": ("SEND 8 B half round trip (us)", 1e6),
    }
    for metric, (label, scale) in labels.items():
        plain, shift = (statistics.median(runs[metric][s]) for s in STACKS)
        each = [s / p for p, s in zip(*(runs[metric][s] for s in STACKS), strict=True)]
        rounds = f"{min(each):.2f} .. {max(each):.2f}"
        ratio = shift / plain
        print(
            f"{label:34} {plain * scale:10.1f} {shift * scale:10.1f} {ratio:7.3f}   {rounds:14} "
            f"{verdict(metric, ratio)}"
        )
    lat, bw = (statistics.median(runs[m]["shift"]) for m in ("latency", "bandwidth"))
    print(
        f"\npeers on the same link: qperf tcp_lat {peers.tcp_lat * 1e6:.1f} us"
        f" (shift {lat / peers.tcp_lat:.2f}x), iperf3 one stream {peers.iperf3 * 1e-6:.1f} MB/s"
        f" (shift {bw / peers.iperf3:.2f}x)"
    )


if __name__ == "__main__":
    sys.exit(main())
