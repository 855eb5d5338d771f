"""All-reduce bus bandwidth of libshift.collectives against the provider's own write bandwidth, one run.

Builds a lab (prefix `cob`; 2 hosts x 2 NICs unless --ranks says otherwise) and runs one rank per host
(this file with --rank) doing float32 SUM all-reduces from 4 KiB to 64 MiB, between two measurements of
`shift-perf write_bw` h0 -> h1 on mlx5_0 (libshift.perf, 1 MiB messages as in perf_tcp_provider.py: with
128 in flight, larger ones can outlast the ack deadline on a loaded machine). Bus bandwidth is
bytes * 2(n-1)/n / time, the rate at which each rank's link carries the all-reduce; every row carries its
ratio to the better write_bw (on a shared machine the two differ; the better one is the fair bound).
Target: >= 0.7 at 64 MiB. Needs root.

Usage: .venv/bin/python bench/collectives_bw.py [--ranks N] [--sizes 4096,...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from libshift.collectives import Communicator, FileStore
from libshift.collectives.ring import CHUNK
from libshift.perf import Row
from shiftd.lab import Lab

SIZES = [4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
TARGET = (64 << 20, 0.7)
BASELINE_SIZE = 1 << 20  # write_bw's message size
BYTES_PER_SIZE = 512 << 20  # iterations per size: about this many bytes, within [3, 200]


def iterations(size: int) -> int:
    return max(3, min(200, BYTES_PER_SIZE // size))


def rank_main(args: argparse.Namespace) -> None:
    """One rank: for every size, a warm-up, then timed all-reduces between barriers; rank 0 prints."""
    with Communicator(FileStore(args.store), args.rank, args.ranks, timeout=120) as comm:
        rows = []
        for size in args.sizes:
            x = np.zeros(size // 4, np.float32)  # stays finite however often it is summed
            comm.all_reduce(x)
            iters = iterations(size)
            comm.barrier()
            start = time.perf_counter()
            for _ in range(iters):
                comm.all_reduce(x)
            seconds = (time.perf_counter() - start) / iters
            comm.barrier()
            rows.append({"size": size, "iterations": iters, "seconds": seconds})
    if args.rank == 0:
        print(json.dumps(rows), flush=True)


def write_bw(lab: Lab) -> float:
    """The provider's write bandwidth h0 -> h1 on mlx5_0 (bytes/s), from libshift.perf."""
    perf = [sys.executable, "-m", "libshift.perf", "write_bw", "-d", "mlx5_0", "-s", str(BASELINE_SIZE)]
    perf.append("--json")
    argv, env = lab.exec_command("h1", perf)
    server = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        server.stdout.readline()  # "waiting on ...": the server listens
        argv, env = lab.exec_command("h0", [*perf, lab.shape.rail_address(0, 1)])
        client = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
        if client.returncode != 0:
            raise SystemExit(f"collectives_bw: write_bw: {client.stderr.strip()}")
        (row,) = json.loads(client.stdout)
        return Row(**row).value
    finally:
        server.wait(timeout=60)


def all_reduce_rows(lab: Lab, ranks: int, sizes: list[int]) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="cob-") as tmp:
        procs = []
        for rank in range(ranks):
            me = [sys.executable, __file__, "--rank", str(rank), "--ranks", str(ranks), "--store", tmp]
            argv, env = lab.exec_command(f"h{rank}", [*me, "--sizes", ",".join(map(str, sizes))])
            procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        outputs = [proc.communicate(timeout=1800) for proc in procs]
    for rank, (proc, (_, err)) in enumerate(zip(procs, outputs, strict=True)):
        if proc.returncode != 0:
            raise SystemExit(f"collectives_bw: rank {rank} failed: {err.decode().strip()[-2000:]}")
    return json.loads(outputs[0][0])


def table(rows: list[dict], ranks: int, limit: float) -> str:
    lines = [f"{'bytes':>10} {'iters':>6} {'time':>11} {'bus bw':>13} {'write_bw':>13} {'ratio':>6}"]
    for row in rows:
        bus = row["size"] * 2 * (ranks - 1) / ranks / row["seconds"]
        mark = ""
        if row["size"] == TARGET[0]:
            mark = f"   target >= {TARGET[1]}: {'met' if bus / limit >= TARGET[1] else 'MISSED'}"
        lines.append(
            f"{row['size']:>10} {row['iterations']:>6} {row['seconds'] * 1e3:>8.2f} ms "
            f"{bus / 1e6:>8.1f} MB/s {limit / 1e6:>8.1f} MB/s {bus / limit:>6.2f}{mark}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2, help="ranks, one per lab host (default 2)")
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=SIZES)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        rank_main(args)
        return 0
    if args.ranks < 2:
        print("collectives_bw: --ranks must be at least 2", file=sys.stderr)
        return 2
    lab = Lab(f"cob{os.getpid() % 100000}", hosts=args.ranks, nics=2)
    lab.up()
    try:
        before = write_bw(lab)
        rows = all_reduce_rows(lab, args.ranks, args.sizes)
        after = write_bw(lab)
    finally:
        lab.down()
    limit = max(before, after)
    print(
        f"all-reduce float32 SUM, {args.ranks} ranks (chunks up to {CHUNK} B); write_bw h0 -> h1 at "
        f"{BASELINE_SIZE} B messages: "
        f"{before / 1e6:.1f} MB/s before, {after / 1e6:.1f} MB/s after"
    )
    print(table(rows, args.ranks, limit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
