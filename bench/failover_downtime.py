"""Failover downtime: from the link going down to the first good completion on the backup NIC.

h0 streams to h1 over one shift QP (SEND, RDMA_WRITE or RDMA_READ; 4 KiB, 16 outstanding) on a 2x2 lab.
Each trial takes the link of h0's mlx5_0 down and times, on CLOCK_MONOTONIC:
  t0          just before the netlink RTM_NEWLINK that sets the link down is sent: by default h0's port
              on the rail-0 switch (h0 loses carrier, as when a cable or switch port dies), with
              --fault link h0's own ens1f0np0 (as `ip link set down` on the host);
  downtime    t0 -> the sender polls the first successful completion of a WR posted after the kernel
              acked the request: such a WR cannot have gone over the dead link, so its completion is the
              first good one on the backup (one posted between t0 and the ack may still have made it);
and, for the breakdown, when shiftd saw the link change and when the application's agent got the NIC event.
With --steps both peers also keep the moments of their switch's steps (libshift.shift.steps), and a second
table gives, per stream, the median time after t0 of each step on each host: where the downtime goes.
Then the link comes back, shiftd reports the NIC UP after its hold-down, the QPs fail back, and once both
sides are on mlx5_0 with the backup re-armed the next trial starts. Target: median downtime under 1 ms.

    sudo .venv/bin/python bench/failover_downtime.py [--trials 30] [--modes send,write,read] [--steps]
"""

from __future__ import annotations

import statistics
import sys
from typing import Any

from failover_lab import Pair, arguments, lab_for, progress, save, summary, switch_port
from nic_event_latency import LinkSet, set_link

from shiftlab.lab import Lab

TARGET_MS = 1.0
# the context's own link watch; shiftd's event through the agent; a QP's error completion (the ack deadline:
# when the kernel told of the link late, after the carrier had come back, no one heard of it)
DETECTIONS = ("link_event", "nic_event", "error_completion")


def fault(lab: Lab, kind: str, up: bool) -> LinkSet:
    if kind == "port":
        return switch_port(lab, "h0", up)
    return set_link(lab.namespace("h0"), lab.shape.netdev(0), up)


def trials(lab: Lab, mode: str, count: int, kind: str, keep_steps: bool) -> dict[str, Any]:
    samples, windows = [], []
    with Pair(lab, "--mode", mode, *(["--steps"] if keep_steps else [])) as pair:
        pair.sender.send(stream=True)
        pair.settle()
        for i in range(count):
            pair.sender.ask("armed", arm=True)  # a WR beyond the window every 50 us from now
            down = fault(lab, kind, up=False)
            t0 = down.asked
            resumed = pair.sender.ask("resumed", mark=t0, after=down.done)
            if not resumed["resumed"]:
                raise SystemExit(f"{mode}: trial {i + 1} did not resume: {resumed}")
            arrived, seen = resumed["nic_event"] or (None, None)
            first = resumed["first_ns"]
            windows.append((t0, first))
            samples.append(
                {
                    "downtime_ms": (first - t0) / 1e6,
                    "shiftd_ms": (seen - t0) / 1e6 if seen else float("nan"),
                    "agent_ms": (arrived - t0) / 1e6 if arrived else float("nan"),
                    "libshift_ms": (first - arrived) / 1e6 if arrived else float("nan"),
                }
            )
            fault(lab, kind, up=True)
            pair.settle()
            progress(f"{mode}: {i + 1}/{count}, last {samples[-1]['downtime_ms']:.2f} ms")
        sent, received = pair.stop()
    errors = sent["errors"] + received["errors"]
    if errors:
        raise SystemExit(f"{mode}: errors reached the application: {errors}")
    moments = {"h0": sent["steps"], "h1": received["steps"]} if keep_steps else {}
    return {"samples": samples, "steps": step_times(moments, windows)}


def step_times(moments: dict[str, list[list[Any]]], windows: list[tuple[int, int]]) -> dict[str, list[float]]:
    """Per "host step": in each trial's window (t0 to the first good completion), ms from t0 to the step's
    first moment on that host; a trial in which a step did not happen in time has no entry for it. A
    host's "detected" is the first of its DETECTIONS (the one that moved the QPs)."""
    found: dict[str, list[float]] = {}
    for t0, first in windows:
        for host, kept in moments.items():
            seen: dict[str, int] = {}
            for ns, _qp, step in kept:
                if t0 <= ns <= first:
                    seen.setdefault(step, ns)
            heard = [seen[step] for step in DETECTIONS if step in seen]
            if heard:
                seen["detected"] = min(heard)
            for step, ns in seen.items():
                found.setdefault(f"{host} {step}", []).append((ns - t0) / 1e6)
    return found


def print_table(results: dict[str, list[dict[str, float]]], kind: str) -> None:
    what = "h0's switch port (carrier lost)" if kind == "port" else "h0's link set down"
    print(f"\nFailover downtime, t0 = the netlink request that takes {what} down (ms, CLOCK_MONOTONIC)")
    print("downtime: t0 -> first successful completion of a WR posted once the link was down (the backup)\n")
    header = (
        f"{'stream':7} {'trials':>6} {'median':>8} {'p99':>8} {'max':>8}   "
        f"{'shiftd saw':>10} {'agent got':>10} {'libshift':>9}   target"
    )
    print(header)
    print("-" * len(header))
    for mode, samples in results.items():
        down = summary([s["downtime_ms"] for s in samples])
        parts = [summary([s[k] for s in samples])["median"] for k in ("shiftd_ms", "agent_ms", "libshift_ms")]
        verdict = "met" if down["median"] < TARGET_MS else "MISSED"
        print(
            f"{mode:7} {down['n']:6d} {down['median']:8.3f} {down['p99']:8.3f} {down['max']:8.3f}   "
            f"{parts[0]:10.3f} {parts[1]:10.3f} {parts[2]:9.3f}   median < {TARGET_MS:g} ms: {verdict}"
        )
    print("\nshiftd saw / agent got: medians of t0 -> shiftd's monitor, t0 -> the NIC event at the")
    print("application's agent; libshift: agent got -> first good completion (switch, handshake, replay).")
    print("The context's own link watch (on unless SHIFT_LINK_WATCH=0) usually moves the QPs before the")
    print("agent gets shiftd's event: --steps shows which came first (link_event, nic_event).")


def print_steps(results: dict[str, dict[str, Any]]) -> None:
    """Where the downtime goes: each step's median time after t0, in the order the steps came."""
    for mode, result in results.items():
        found, samples = result["steps"], result["samples"]
        print(f"\n{mode}: where the downtime goes (ms after t0; median, min and max over trials)")
        rows = sorted(found.items(), key=lambda item: statistics.median(item[1]))
        rows.append(("h0 first good completion", [s["downtime_ms"] for s in samples]))
        for name, times in rows:
            print(
                f"  {name:28} {statistics.median(times):8.3f} {min(times):8.3f} {max(times):8.3f}"
                f"   ({len(times)}/{len(samples)} trials)"
            )
    print("\nlink_event: the link watch saw the carrier go; nic_event: shiftd's NIC event reached the")
    print("context; error_completion: a QP's ack deadline passed (no one heard of the link in time);")
    print("detected: the first of these; switch: a QP began to leave its path;")
    print("old_path_stopped: nothing more lands there, its count is final; count_sent: the count goes")
    print("out on the new path; peer_count: the peer's came; replay_posted: what the peer lacks")
    print("is posted on the new path; marked: the sender has t0 and posts one WR more, the one whose")
    print("completion ends the downtime.")


def main() -> int:
    parser = arguments(__doc__.splitlines()[0], trials=30)
    parser.add_argument("--modes", default="send,write,read", help="streams to time (default all three)")
    parser.add_argument("--fault", choices=["port", "link"], default="port", help="which link goes down")
    parser.add_argument("--steps", action="store_true", help="also show where the downtime goes, by step")
    args = parser.parse_args()
    modes = args.modes.split(",")
    results: dict[str, Any] = {}
    with lab_for(args) as lab:
        for mode in modes:
            results[mode] = trials(lab, mode, args.trials, args.fault, args.steps)
    print(file=sys.stderr)
    samples = {mode: result["samples"] for mode, result in results.items()}
    print_table(samples, args.fault)
    if args.steps:
        print_steps(results)
    save(args, {"fault": args.fault, "trials": samples, "steps": {m: r["steps"] for m, r in results.items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
