"""Many QPs on one NIC failing over at once: the time until all carry traffic again, and what a backup costs.

On a 2x2 lab, h0 opens --qps shift QPs (default 1000) on mlx5_0 to h1, one CQ for all, and streams
RDMA_WRITEs of 4 KiB round-robin, 1 outstanding per QP. Each trial takes h0's port on the rail-0 switch
down (t0: just before the netlink request is sent) and times, for every QP, the first successful completion
of a WR posted after t0 (it can only have gone over the backup): the first QP, the median QP and the last
QP, i.e. when all carry traffic again. The port then comes back and all QPs fail back before the next trial.

The floor: the same measure with no fault, as many rounds as trials, on the shift QPs and on the bare
provider's: t0 is now, the sender is told it as in a trial, and the rounds time its loop until every QP
has completed a WR posted after t0. A trial cannot be faster than that loop with nothing failed.

Memory: the same program with the bare provider's QPs (--plain: no backup QP, no control MRs, no shiftd)
gives the baseline; the resident memory the QPs add (after connecting and streaming), shift minus plain,
divided by the QP count, is what each backup costs (backup QP, its connection, control MRs, ledger).

With --steps both peers keep the moments of their switches' steps (libshift.shift.steps), and a second table
gives, per host and step, when the first QP, half of them and the last one took it: the core's part of the
storm against the application's (the sender's Python loop over every QP, and the order that tells it t0).

    sudo .venv/bin/python bench/many_qp_failover.py [--qps 1000] [--trials 3] [--steps]
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import defaultdict
from typing import Any

from failover_lab import Pair, arguments, lab_for, progress, save, summary, switch_port

from shiftlab.lab import Lab

STREAM = ("--mode", "write", "--size", "4096", "--window", "1")
Samples = list[dict[str, float]]  # per trial or round: ms from t0 to the first, the median and the last QP


def memory(lab: Lab, qps: int, plain: bool, rounds: int) -> tuple[dict[str, float], Samples]:
    """KiB of resident memory the QPs add on each side, connected and after a short stream; and `rounds`
    of the storm's measure with no fault (no_fault)."""
    with Pair(lab, *STREAM, "--qps", str(qps), *(["--plain"] if plain else [])) as pair:
        pair.sender.ask("burst", burst=1.0)
        pair.sender.send(stream=True)
        floors = [no_fault(pair) for _ in range(rounds)]
        return added_rss(pair, pair.stop()), floors


def no_fault(pair: Pair) -> dict[str, float]:
    """The storm's measure with no fault, on a stream: from now (t0) until every QP has completed a WR
    posted after t0, the sender told t0 as in a trial. What the application's loop over the QPs costs by
    itself: the floor under a trial's figures."""
    time.sleep(0.5)
    t0 = time.monotonic_ns()
    resumed = pair.sender.ask("resumed", mark=t0, after=t0, timeout=120)
    if not resumed["resumed"]:
        raise SystemExit(f"with no fault, only {resumed['qps']} QPs completed a WR: {resumed}")
    return {k: (resumed[f"{k}_ns"] - t0) / 1e6 for k in ("first", "median", "all")}


def added_rss(pair: Pair, done: tuple[dict[str, Any], dict[str, Any]]) -> dict[str, float]:
    """KiB each side's QPs added: resident memory at the end less that before the QPs were made."""
    return {
        host: end["rss"] - ends["rss"][0]
        for host, end, ends in zip(("h0", "h1"), done, pair.created, strict=True)
    }


def failovers(
    lab: Lab, qps: int, trials: int, keep_steps: bool
) -> tuple[Samples, Samples, float, dict[str, float], dict[str, list[float]]]:
    """The trials' samples, as many rounds with no fault, the time to connect, the memory the QPs added,
    and the moments of the steps."""
    samples, windows = [], []
    progress(f"connecting {qps} shift QPs...")
    with Pair(
        lab, *STREAM, "--qps", str(qps), *(["--steps"] if keep_steps else []), connect_timeout=600
    ) as pair:
        connect_s = max(end["connected_s"] for end in pair.connected)
        pair.sender.send(stream=True)
        pair.settle()
        floors = [no_fault(pair) for _ in range(trials)]
        for i in range(trials):
            down = switch_port(lab, "h0", up=False)
            t0 = down.asked
            resumed = pair.sender.ask("resumed", mark=t0, after=down.done, timeout=120)
            if not resumed["resumed"]:
                raise SystemExit(f"trial {i + 1}: only {resumed['qps']} of {qps} QPs resumed: {resumed}")
            samples.append({k: (resumed[f"{k}_ns"] - t0) / 1e6 for k in ("first", "median", "all")})
            windows.append((t0, resumed["all_ns"]))
            switch_port(lab, "h0", up=True)
            pair.settle()
            progress(f"{qps} QPs: trial {i + 1}/{trials}, all resumed after {samples[-1]['all']:.1f} ms")
        done = pair.stop()
    errors = done[0]["errors"] + done[1]["errors"]
    if errors:
        raise SystemExit(f"errors reached the application: {errors}")
    moments = {"h0": done[0]["steps"], "h1": done[1]["steps"]} if keep_steps else {}
    return samples, floors, connect_s, added_rss(pair, done), spread(moments, windows)


def spread(moments: dict[str, list[list[Any]]], windows: list[tuple[int, int]]) -> dict[str, list[float]]:
    """Per "host step", the medians over trials of when (ms after t0) the first QP, half of the QPs and the
    last QP took the step: each QP's first moment of it between t0 and the trial's last resumed QP."""
    per_trial: dict[str, list[list[float]]] = defaultdict(list)
    for t0, end in windows:
        for host, kept in moments.items():
            firsts: dict[str, dict[int, int]] = defaultdict(dict)
            for ns, qp, step in kept:
                if t0 <= ns <= end:
                    firsts[step].setdefault(qp, ns)
            for step, by_qp in firsts.items():
                times = sorted((ns - t0) / 1e6 for ns in by_qp.values())
                per_trial[f"{host} {step}"].append([times[0], times[len(times) // 2], times[-1]])
    return {
        name: [statistics.median(col) for col in zip(*rows, strict=True)] for name, rows in per_trial.items()
    }


def print_table(
    qps: int, samples: list[dict[str, float]], connect_s: float, rss: dict[str, dict[str, float]]
) -> None:
    print(f"\n{qps} QPs on mlx5_0 failing over at once")
    print("t0 = the netlink request that takes h0's switch port down (ms, CLOCK_MONOTONIC)\n")
    header = f"{'time from t0 until ... (ms)':40} {'median':>9} {'p99':>9} {'max':>9}"
    print(header)
    print("-" * len(header))
    labels = {
        "first": "the first QP carries traffic again",
        "median": "half of the QPs do",
        "all": "all QPs do",
    }
    for key, label in labels.items():
        stats = summary([s[key] for s in samples])
        print(f"{label:40} {stats['median']:9.1f} {stats['p99']:9.1f} {stats['max']:9.1f}")
    print(f"\nconnecting the {qps} shift QPs (backup lookups included): {connect_s:.1f} s\n")
    header = f"{'resident memory of the QPs (KiB)':40} {'plain':>9} {'shift':>9} {'per backup':>11}"
    print(header)
    print("-" * len(header))
    for host in ("h0", "h1"):
        plain, shift = rss["plain"][host], rss["shift"][host]
        role = f"{host} ({'sender' if host == 'h0' else 'receiver'})"
        print(f"{role:40} {plain:9.0f} {shift:9.0f} {(shift - plain) / qps:11.1f}")


def print_floors(floors: dict[str, Samples]) -> None:
    """The same measure with no fault: how long the sender's loop takes to see a WR complete on every QP
    when nothing failed, the floor under the trials' figures."""
    print("\nwith no fault: from t0 = now until ... (ms, medians over rounds)\n")
    header = f"{'':24} {'first QP':>9} {'half':>9} {'all QPs':>9}"
    print(header)
    print("-" * len(header))
    for name, rounds in floors.items():
        first, half, last = (statistics.median(r[k] for r in rounds) for k in ("first", "median", "all"))
        print(f"{name:24} {first:9.1f} {half:9.1f} {last:9.1f}")


def print_steps(found: dict[str, list[float]], samples: list[dict[str, float]]) -> None:
    print("\nwhere the time goes (ms after t0, medians over trials)\n")
    header = f"{'host step':28} {'first QP':>9} {'half':>9} {'last QP':>9}"
    print(header)
    print("-" * len(header))
    rows = sorted(found.items(), key=lambda item: item[1][0])
    rows.append(
        (
            "h0 carries traffic again",
            [summary([s[k] for s in samples])["median"] for k in ("first", "median", "all")],
        )
    )
    for name, (first, half, last) in rows:
        print(f"{name:28} {first:9.1f} {half:9.1f} {last:9.1f}")
    print("\nswitch .. replay_posted: the core's steps (failover_downtime.py --steps says what each is);")
    print("marked: the sender has t0 and posts one WR more on every QP; carries traffic again: a WR posted")
    print("after the fault has completed, as the sender's loop over the QPs sees it.")


def main() -> int:
    parser = arguments(__doc__.splitlines()[0], trials=3)
    parser.add_argument("--qps", type=int, default=1000, help="QPs on the one NIC (default 1000)")
    parser.add_argument("--steps", action="store_true", help="also show when the QPs took each step")
    args = parser.parse_args()
    rss: dict[str, Any] = {}
    with lab_for(args) as lab:
        progress(f"baseline: {args.qps} plain QPs...")
        rss["plain"], floors_plain = memory(lab, args.qps, True, args.trials)
        samples, floors, connect_s, rss["shift"], found = failovers(lab, args.qps, args.trials, args.steps)
    print(file=sys.stderr)
    print_table(args.qps, samples, connect_s, rss)
    print_floors({"shift QPs": floors, "bare QPs (--plain)": floors_plain})
    if args.steps:
        print_steps(found, samples)
    results = {"qps": args.qps, "trials": samples, "no_fault": {"shift": floors, "plain": floors_plain}}
    save(args, {**results, "connect_s": connect_s, "rss_kib": rss, "steps": found})
    return 0


if __name__ == "__main__":
    sys.exit(main())
