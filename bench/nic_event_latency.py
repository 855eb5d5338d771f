"""NIC event latency: from a link going down to the event at a gRPC subscriber in another process.

On a lab host (1 host x 2 NICs), each trial takes a link down and times, on CLOCK_MONOTONIC
(shared by all processes of the machine):
  - kernel -> shiftd: when shiftd's monitor saw it (NicEvent.monotonic_nanos);
  - kernel -> agent: when an agent process, subscribed with Agent.WatchNicEvents on a channel set up as
    libshift's agent sets up its own (CHANNEL_OPTIONS), received it;
  - shiftd monitor -> agent: the difference (health, the event fan-out, the gRPC stream write, the
    socket relay and the client's read: what the daemon's code decides).
The floor, kernel -> a bare Python netlink socket in another process, is measured in a pass of its
own with the same daemon and subscriber running: a listener woken in the same instant as shiftd would
take one of this machine's two cores from the very path it measures.
Two kinds of failure: the switch port going down (the host loses carrier, as when a cable or
switch port dies) and the host's own link set down (as `shiftctl fail-nic --mode down` does).

    sudo .venv/bin/python bench/nic_event_latency.py [--trials 50]
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

from shiftlab import netns
from shiftlab.lab import Lab

SUBSCRIBER = """
import sys, time
from libshift.agent import CHANNEL_OPTIONS  # libshift before grpc: see libshift/grpc_polling.py
import grpc
from libshift.api.shift.v1 import agent_pb2, agent_pb2_grpc
with grpc.insecure_channel("unix:" + sys.argv[1], options=CHANNEL_OPTIONS) as channel:
    stub = agent_pb2_grpc.AgentStub(channel)
    agent_id = stub.Register(agent_pb2.RegisterRequest(name="bench"), timeout=10).agent_id
    print("ready", flush=True)
    for event in stub.WatchNicEvents(agent_pb2.WatchNicEventsRequest(agent_id=agent_id)):
        now = time.monotonic_ns()
        print(now, event.monotonic_nanos, event.device, event.state, flush=True)
"""

RAW_LISTENER = """
import socket, sys, time
sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
sock.bind((0, 1))  # RTMGRP_LINK
print("ready", flush=True)
while True:
    sock.recv(65536)
    print(time.monotonic_ns(), flush=True)
"""

STATE_DOWN, STATE_UP = 2, 1


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


class Line:
    """Reads the lines a helper process prints, with a deadline."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        os.set_blocking(proc.stdout.fileno(), False)
        self.buffer = b""

    def next(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no line from helper")
            select.select([self.proc.stdout], [], [], left)  # asleep while the trial runs
            self.buffer += self.proc.stdout.read() or b""
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()

    def drain(self) -> None:
        while (chunk := self.proc.stdout.read()) is not None and chunk:
            self.buffer += chunk
        self.buffer = b""


def spawn(lab: Lab, code: str, *args: str) -> tuple[subprocess.Popen, Line]:
    argv, env = lab.exec_command("h0", [sys.executable, "-c", code, *args])
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE)
    line = Line(proc)
    assert line.next(30) == "ready"
    return proc, line


def wait_event(line: Line, device: str, state: int, timeout: float = 10.0) -> tuple[int, int]:
    deadline = time.monotonic() + timeout
    while True:
        arrived, seen, dev, st = line.next(max(0.01, deadline - time.monotonic())).split()
        if dev == device and int(st) == state:
            return int(arrived), int(seen)


RTM_NEWLINK, NLM_F_REQUEST, NLM_F_ACK, IFF_UP = 16, 1, 4, 1


def link_request(index: int, up: bool) -> bytes:
    """RTM_NEWLINK that sets a link up or down, built in advance so that t0 is the send itself."""
    body = struct.pack("=BxHiII", socket.AF_UNSPEC, 0, index, IFF_UP if up else 0, IFF_UP)
    return struct.pack("=IHHII", 16 + len(body), RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK, 1, 0) + body


class LinkSet(NamedTuple):
    """When a link was set up or down (CLOCK_MONOTONIC ns): `asked` just before the kernel got the request,
    `done` at its ack. The kernel acks once the link has changed, so a packet sent after `done` cannot have
    used the old state, while one sent between the two may have."""

    asked: int
    done: int


def set_link(ns: str, ifname: str, up: bool) -> LinkSet:
    """Take the link up or down inside `ns`, timed."""

    def inside() -> LinkSet:
        # the injector is no part of what is measured: run at a real-time priority so that the busy
        # peers cannot preempt it between the kernel's change and its ack (which would stretch `done`)
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        index = socket.if_nametoindex(ifname)
        request = link_request(index, up)
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
            asked = time.monotonic_ns()
            sock.send(request)
            sock.recv(4096)  # the ack
            return LinkSet(asked, time.monotonic_ns())

    return netns.run(ns, inside)


def trial(ns: str, ifname: str, subscriber: Line, raw: Line | None) -> dict[str, float]:
    """One link-down, timed; then the link back up and the NIC UP again (after the hold-down)."""
    if raw is not None:
        raw.drain()
    started = set_link(ns, ifname, up=False).asked
    arrived, seen = wait_event(subscriber, "mlx5_0", STATE_DOWN)
    sample = {
        "shiftd_ms": (seen - started) / 1e6,
        "agent_ms": (arrived - started) / 1e6,
        "agent_after_shiftd_ms": (arrived - seen) / 1e6,
    }
    if raw is not None:
        sample = {"raw_ms": (int(raw.next(5)) - started) / 1e6}
    set_link(ns, ifname, up=True)
    wait_event(subscriber, "mlx5_0", STATE_UP)
    return sample


def timed_pass(
    label: str, trials: int, ns: str, ifname: str, subscriber: Line, raw: Line | None
) -> list[dict[str, float]]:
    samples = []
    for i in range(trials):
        samples.append(trial(ns, ifname, subscriber, raw))
        print(f"\r{label}: {i + 1}/{trials}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--json", type=Path, default=Path("bench/out/nic_event_latency.json"))
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("nic_event_latency: needs root (network namespaces)", file=sys.stderr)
        return 1
    lab = Lab(f"bench{os.getpid() % 10000}", hosts=1, nics=2)
    results: dict[str, list[dict[str, float]]] = {}
    procs: list[subprocess.Popen] = []
    try:
        print(f"bringing up lab {lab.name} (1 host x 2 NICs)...", file=sys.stderr)
        lab.up()
        sub_proc, subscriber = spawn(lab, SUBSCRIBER, str(lab.socket("h0")))
        procs.append(sub_proc)
        wait_event(subscriber, "mlx5_0", STATE_UP)  # the snapshot
        kinds = {
            "switch port down (carrier lost)": (lab.shape.rail_ns(0), "h0"),
            "host link set down": (lab.namespace("h0"), "ens1f0np0"),
        }
        for kind, (ns, ifname) in kinds.items():
            results[kind] = timed_pass(kind, args.trials, ns, ifname, subscriber, None)
            raw_proc, raw = spawn(lab, RAW_LISTENER)
            procs.append(raw_proc)
            floor = timed_pass(f"{kind}, floor", args.trials, ns, ifname, subscriber, raw)
            raw_proc.kill()
            raw_proc.wait()
            procs.remove(raw_proc)
            for sample, floor_sample in zip(results[kind], floor, strict=True):
                sample.update(floor_sample)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        lab.down()
    print_table(results, args.trials)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1))
    return 0


def print_table(results: dict[str, list[dict[str, float]]], trials: int) -> None:
    print(f"\nNIC event latency, {trials} trials each (ms, CLOCK_MONOTONIC across processes)\n")
    header = f"{'failure':34} {'path':38} {'median':>8} {'p90':>8} {'p99':>8} {'max':>8} {'x raw':>6}"
    print(header)
    print("-" * len(header))
    paths = [
        ("raw_ms", "kernel -> raw netlink socket (floor)"),
        ("shiftd_ms", "kernel -> shiftd monitor"),
        ("agent_ms", "kernel -> agent (gRPC stream)"),
        ("agent_after_shiftd_ms", "shiftd monitor -> agent"),
    ]
    for kind, samples in results.items():
        raw_median = statistics.median(s["raw_ms"] for s in samples)
        for key, label in paths:
            values = [s[key] for s in samples]
            median = statistics.median(values)
            print(
                f"{kind:34} {label:38} {median:8.3f} {percentile(values, 90):8.3f} "
                f"{percentile(values, 99):8.3f} {max(values):8.3f} {median / raw_median:6.1f}"
            )


if __name__ == "__main__":
    sys.exit(main())
