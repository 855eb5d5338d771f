"""The tcp provider against the machine's own TCP: shift-perf server and client on two namespaces.

Builds two network namespaces joined by a veth pair (prefix `lt`), runs `shift-perf` as a server in one and
as a client in the other for write_bw, send_bw, read_bw (64 KiB and 1 MiB) and send_lat (8 B), and prints one
table in which every row carries its ratio to a raw TCP stream / raw TCP ping-pong over the same veth,
measured in the same run. Targets: WRITE and SEND at 1 MiB >= 0.8 of the raw stream; 8-byte SEND latency
<= 2x the raw ping-pong half round trip.

    sudo .venv/bin/python bench/perf_tcp_provider.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from libshift.perf import Row, table
from shiftlab.veth import VethPair

RUNS = [("write_bw", 65536), ("write_bw", 1 << 20), ("send_bw", 65536), ("send_bw", 1 << 20)]
RUNS += [("read_bw", 65536), ("read_bw", 1 << 20), ("send_lat", 8)]
TARGETS = {
    ("write_bw", 1 << 20): (">=", 0.8),
    ("send_bw", 1 << 20): (">=", 0.8),
    ("send_lat", 8): ("<=", 2.0),
}


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


def verdict(row: Row) -> str:
    target = TARGETS.get((row.test, row.size))
    if target is None:
        return ""
    sign, bound = target
    met = row.ratio >= bound if sign == ">=" else row.ratio <= bound
    return f"target {sign} {bound}: {'met' if met else 'MISSED'}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.parse_args()
    if os.geteuid() != 0:
        print("perf_tcp_provider: needs root (network namespaces)", file=sys.stderr)
        return 1
    with VethPair("lt", "198.18.97") as fabric:
        env = dict(os.environ, SHIFT_TCP_DEVICES=fabric.tcp_devices("lt_cli", "lt_srv"))
        rows = []
        for test, size in RUNS:
            rows.append(one(fabric, env, test, size))
            time.sleep(0.2)  # let the server's port go
    lines = table(rows).splitlines()
    print(lines[0])
    for line, row in zip(lines[1:], rows, strict=True):
        print(f"{line}   {verdict(row)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
