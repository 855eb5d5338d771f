"""Gray failures: a lossy or slow path under a stream, found from the traffic's own behaviour and left.

h0 streams RDMA_WRITE to h1 over one shift QP on a 2x2 lab. Each trial of a fault:
  1. a burst on the healthy path: the throughput before;
  2. the fault, on rail 0's switch (no shiftd is told, no link goes down): a lossy port towards h0 (each
     packet dropped with the chance given, both ways), or a slow port towards h1 (tbf at the rate given,
     once with shiftd's 50 ms of queue, whose drops when it is full are a loss too, and once behind a
     queue of 5 s, which drops nothing: only the speed judge can find that one);
     t0 is when it is in place (CLOCK_REALTIME, the clock of shiftd's failover reports);
  3. a burst of --during s: the detection and the move happen in it;
  4. a burst of --after s, the fault still on: where the traffic runs now;
  5. the fault removed; the trial ends when the stream is home again (the judge's hold: 5 s on the lab).
Reported per fault: the time from t0 to the first failover report of either host (the traffic moved),
what found it (the detecting host's reason: the loss judge's move is a nic_event, the default path's ack
deadline an error_completion; the other host follows, peer_notification), how many moves the trial had
(a failback onto a link still lossy is found again), and the throughput during and after as ratios of
before. Then the false moves: --quiet seconds of full load on the healthy lab, and the failovers both
shiftds counted meanwhile. --detect-timeout sets the default path's ack deadline (SHIFT_DETECT_TIMEOUT) of
the peers: 18 (1.07 s a try) leaves the loss judge alone to find a loss.

    sudo .venv/bin/python bench/gray_failure.py [--trials 3] [--loss 1,5,20] [--rate 200mbit] [--quiet 600]
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from failover_lab import Pair, arguments, lab_for, progress, save

from libshift.api.shift.v1 import admin_pb2, common_pb2
from shiftd.ctl import Client
from shiftd.fault_spec import FaultSpecError, format_rate, parse_rate
from shiftlab.lab import Lab
from shiftlab.switch import lossy_port, slow_port

PEER_ARGS = ("--mode", "write", "--size", "65536", "--window", "16")
DEGRADED = common_pb2.NIC_STATE_DEGRADED
TARGET_MOVE_S = 1.0  # at 5% loss: moved within a second ...
TARGET_AFTER = 0.9  # ... and running at 0.9 of the healthy throughput on the backup

Fault = Callable[[Lab], AbstractContextManager[None]]


def failovers_since(lab: Lab, since: float) -> list[tuple[str, common_pb2.FailoverReport]]:
    """Every failover (not failback) either shiftd was told of after `since` (time.time()), with its host,
    in time order."""
    found = []
    for host in lab.host_names:
        client = Client(str(lab.socket(host)), 30.0)
        try:
            request = admin_pb2.StreamEventsRequest(backlog=500, follow=False)
            events = client.admin.StreamEvents(request, timeout=30)
            found += [(host, e.failover) for e in events if e.HasField("failover")]
        finally:
            client.close()
    failovers = [
        (host, r)
        for host, r in found
        if r.time_unix_nanos > since * 1e9 and r.kind == common_pb2.FAILOVER_KIND_FAILOVER
    ]
    return sorted(failovers, key=lambda pair: pair[1].time_unix_nanos)


def failovers(lab: Lab) -> int:
    """The failovers both shiftds have counted since they started."""
    total = 0
    for host in lab.host_names:
        client = Client(str(lab.socket(host)), 30.0)
        try:
            total += client.admin.Status(admin_pb2.StatusRequest(), timeout=30).failovers
        finally:
            client.close()
    return total


def verdicts(lab: Lab) -> str:
    """The DEGRADED NICs of rail 0 now, with the judges' reasons ("h0 slow"): which judge moved them."""
    found = []
    for host in lab.host_names:
        client = Client(str(lab.socket(host)), 30.0)
        try:
            nics = client.admin.ListNics(admin_pb2.ListNicsRequest(), timeout=30).nics
        finally:
            client.close()
        found += [f"{host} {n.reason}" for n in nics if n.device == "mlx5_0" and n.state == DEGRADED]
    return ",".join(found)


def burst(pair: Pair, seconds: float) -> float:
    """Stream for `seconds`; bytes a second delivered."""
    answer = pair.sender.ask("burst", timeout=seconds + 60, burst=seconds)
    if answer["errors"]:
        raise SystemExit(f"errors reached the application: {answer['errors']}")
    return answer["burst"] / answer["seconds"]


def trial(lab: Lab, pair: Pair, fault: Fault, during: float, after: float) -> dict[str, Any]:
    before = burst(pair, 1.0)
    with fault(lab):
        t0 = time.time()
        rate_during = burst(pair, during)
        rate_after = burst(pair, after)
        moved = failovers_since(lab, t0)
        verdict = verdicts(lab)  # within the judge's hold still
    pair.settle()  # home again: the judge's hold has passed with nothing lost
    found = [f"{host} {r.reason}" for host, r in moved if r.reason != "peer_notification"]
    return {
        "before": before,
        "during": rate_during / before,
        "after": rate_after / before,
        "moved_s": (moved[0][1].time_unix_nanos / 1e9 - t0) if moved else None,
        "found_by": found[0] if found else "",
        "verdict": verdict,
        "moves": len(found),
    }


def run_faults(
    lab: Lab, faults: dict[str, Fault], trials: int, during: float, after: float
) -> dict[str, list]:
    results: dict[str, list] = {}
    with Pair(lab, *PEER_ARGS) as pair:
        pair.settle()
        for name, fault in faults.items():
            results[name] = []
            for i in range(trials):
                results[name].append(trial(lab, pair, fault, during, after))
                progress(f"{name}: trial {i + 1}/{trials}")
        pair.stop()
    return results


def quiet_run(lab: Lab, seconds: float) -> dict[str, float]:
    """Full load on the healthy lab for `seconds`: the failovers counted meanwhile are false moves."""
    before = failovers(lab)
    with Pair(lab, *PEER_ARGS) as pair:
        pair.settle()
        progress(f"healthy lab under full load for {seconds:g} s...")
        rate = burst(pair, seconds)
        pair.stop()
    return {"seconds": seconds, "rate": rate, "false_moves": failovers(lab) - before}


def median_or_none(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def print_table(results: dict[str, list], quiet: dict[str, float] | None, detect: str) -> None:
    print("\nGray failures on rail 0's switch, h0 -> h1 RDMA_WRITE 64 KiB, one shift QP (trials' medians);")
    print(f"the default path's SHIFT_DETECT_TIMEOUT {detect}\n")
    width = max(len("fault"), *(len(name) for name in results))
    header = (
        f"{'fault':{width}} {'trials':>6} {'moved':>5} {'to move (s)':>11} {'found by':>22} {'verdict':>16} "
        f"{'moves':>5} {'before MB/s':>11} {'during':>6} {'after':>6}"
    )
    print(header)
    print("-" * len(header))
    for name, trials in results.items():
        moved = [t["moved_s"] for t in trials]
        found = sorted({t["found_by"] for t in trials if t["found_by"]})
        verdict = sorted({t["verdict"] for t in trials if t["verdict"]})
        to_move = median_or_none(moved)
        before, during, after, moves = (
            statistics.median(t[k] for t in trials) for k in ("before", "during", "after", "moves")
        )
        print(
            f"{name:{width}} {len(trials):6d} {sum(m is not None for m in moved):5d} "
            f"{'-' if to_move is None else f'{to_move:.2f}':>11} {','.join(found) or '-':>22} "
            f"{','.join(verdict) or '-':>16} {moves:5g} "
            f"{before / 1e6:11.0f} {during:6.2f} {after:6.2f}"
        )
    print(
        "\n- during, after: throughput in the burst with the fault (detection and move included) and in the"
        "\n  one after it, as ratios of the healthy one before (after: on the backup if the traffic moved)."
        "\n- found by: the host that moved first and why (nic_event: a judge of shiftd's); verdict: the"
        "\n  NICs shiftd held DEGRADED at the end, and its judge's reason (retransmits, slow); moves: the"
        "\n  trial's detections (a failback onto a link still lossy is found again)."
        f"\n- the target at 5% loss: moved within {TARGET_MOVE_S:g} s, after >= {TARGET_AFTER:g}."
    )
    if quiet is not None:
        print(
            f"\nHealthy lab under full load for {quiet['seconds']:g} s ({quiet['rate'] / 1e6:.0f} MB/s): "
            f"{quiet['false_moves']} false moves"
        )


def parse_losses(text: str) -> list[float]:
    try:
        losses = [float(x) for x in text.split(",") if x]
    except ValueError:
        raise SystemExit(f"--loss: expected percentages like 1,5,20, not {text!r}") from None
    if not all(0 < x < 100 for x in losses):
        raise SystemExit(f"--loss: each percentage must be between 0 and 100, not {text!r}")
    return losses


def main() -> int:
    parser = arguments(__doc__.splitlines()[0], trials=3)
    parser.add_argument(
        "--loss", default="1,5,20", help="loss percentages of the lossy port (default 1,5,20)"
    )
    parser.add_argument(
        "--rate", default="200mbit", help="the slow port's rate (default 200mbit; '' for none)"
    )
    parser.add_argument("--during", type=float, default=2.0, help="seconds of the burst with the fault")
    parser.add_argument("--after", type=float, default=2.0, help="seconds of the burst after it")
    parser.add_argument("--quiet", type=float, default=600.0, help="seconds of healthy full load (0: none)")
    parser.add_argument(
        "--detect-timeout",
        type=int,
        help="the peers' SHIFT_DETECT_TIMEOUT (default libshift's: 12, 67 ms in all)",
    )
    args = parser.parse_args()
    if args.detect_timeout is not None:
        os.environ["SHIFT_DETECT_TIMEOUT"] = str(args.detect_timeout)  # the peers inherit it
    faults: dict[str, Fault] = {}
    for loss in parse_losses(args.loss):
        faults[f"lossy {loss:g}%"] = lambda lab, loss=loss: lossy_port(lab, 0, "h0", loss)
    if args.rate:
        try:
            rate = parse_rate(args.rate)
        except FaultSpecError as exc:
            raise SystemExit(f"--rate: {exc}") from None
        faults[f"slow {format_rate(rate)}"] = lambda lab: slow_port(lab, 0, "h1", rate)
        # the same rate behind a queue deep enough that nothing is dropped: slow, and nothing lost
        faults[f"slow {format_rate(rate)}, no loss"] = lambda lab: slow_port(lab, 0, "h1", rate, "5s")
    with lab_for(args) as lab:
        results = run_faults(lab, faults, args.trials, args.during, args.after)
        quiet = quiet_run(lab, args.quiet) if args.quiet > 0 else None
    print(file=sys.stderr)
    print_table(results, quiet, os.environ.get("SHIFT_DETECT_TIMEOUT", "12 (libshift's default)"))
    save(args, {"faults": results, "quiet": quiet})
    return 0


if __name__ == "__main__":
    sys.exit(main())
