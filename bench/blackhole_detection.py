"""Black-hole detection: from a silent black hole on the path to resumed traffic on the backup NIC.

h0 streams SEND to h1 over one shift QP on a 2x2 lab. Each trial makes rail 0's switch drop everything
towards h1 (a root "blackhole" qdisc on its port; links and carrier stay up, so no shiftd sees anything) and
times, on CLOCK_MONOTONIC, from t0 (the kernel's ack of the netlink RTM_NEWQDISC) to the sender's first
successful completion of a WR posted after t0. The only detection is the ack deadline of the sender's
default path (4.096 us x 2^timeout x (retry_cnt + 1), then RETRY_EXC_ERR): libshift's detection deadline
there (libshift/shift/detect.py), or the application's QP setting if that is shorter. Each application
setting is a row: the verbs defaults first (the target, under 100 ms, is for them), then NCCL's
(NCCL_IB_TIMEOUT 20, NCCL_IB_RETRY_CNT 7). Between trials the black hole is removed, and the sender's
retries of the default path bring the QP back onto mlx5_0.

    sudo .venv/bin/python bench/blackhole_detection.py [--trials 10] [--settings 14:7,20:7]
"""

from __future__ import annotations

import sys

from failover_lab import Pair, arguments, blackhole, lab_for, progress, save, summary

from libshift.shift.detect import default_path_attr
from libshift.verbs import QPAttr, ack_deadline
from shiftlab.lab import Lab

TARGET_MS = 100.0
DEFAULT = (QPAttr.timeout, QPAttr.retry_cnt)
NCCL = (20, 7)


def trials(lab: Lab, timeout: int, retry_cnt: int, count: int) -> list[float]:
    samples = []
    args = ("--mode", "send", "--timeout", str(timeout), "--retry-cnt", str(retry_cnt))
    with Pair(lab, *args) as pair:
        pair.sender.send(stream=True)
        pair.settle()
        for i in range(count):
            t0 = blackhole(lab, "h1", on=True)
            resumed = pair.sender.ask("resumed", mark=t0)
            blackhole(lab, "h1", on=False)
            if not resumed["resumed"]:
                raise SystemExit(f"{timeout}:{retry_cnt}: trial {i + 1} did not resume: {resumed}")
            samples.append((resumed["first_ns"] - t0) / 1e6)
            pair.settle()  # the sender's retry of the default path: the failback onto mlx5_0
            progress(f"timeout {timeout}, retry_cnt {retry_cnt}: {i + 1}/{count}, last {samples[-1]:.1f} ms")
        sent, received = pair.stop()
    if sent["errors"] or received["errors"]:
        raise SystemExit(f"errors reached the application: {sent['errors'] + received['errors']}")
    return samples


def print_table(results: dict[tuple[int, int], list[float]]) -> None:
    print(
        "\nBlack-hole detection to resumed traffic (ms): t0 = the netlink request that installs the drop-all"
    )
    print("qdisc on rail 0's port towards h1 -> the sender's first good completion of a WR posted after t0\n")
    header = (
        f"{'application QP setting':40} {'its deadline':>12} {'default path':>12} {'trials':>6} "
        f"{'median':>9} {'p99':>9} {'max':>9} {'- detect':>9}   target"
    )
    print(header)
    print("-" * len(header))
    for (timeout, retry_cnt), samples in results.items():
        asked = ack_deadline(timeout, retry_cnt) * 1e3
        used = default_path_attr(QPAttr(timeout=timeout, retry_cnt=retry_cnt))
        detect = ack_deadline(used.timeout, used.retry_cnt) * 1e3
        stats = summary(samples)
        names = {DEFAULT: " (verbs default)", NCCL: " (NCCL default)"}
        label = f"timeout {timeout}, retry_cnt {retry_cnt}" + names.get((timeout, retry_cnt), "")
        verdict = ""
        if (timeout, retry_cnt) == DEFAULT:
            verdict = f"median < {TARGET_MS:g} ms: {'met' if stats['median'] < TARGET_MS else 'MISSED'}"
        print(
            f"{label:40} {asked:12.1f} {detect:12.1f} {stats['n']:6d} {stats['median']:9.1f} "
            f"{stats['p99']:9.1f} {stats['max']:9.1f} {stats['median'] - detect:9.1f}   {verdict}"
        )
    print(
        "\n- default path: the ack deadline libshift puts on the default path (SHIFT_DETECT_TIMEOUT and"
        "\n  SHIFT_DETECT_RETRY_CNT, unless the application's is shorter); the backup keeps the application's"
        "\n  own."
        "\n- detect: median minus that deadline, i.e. what failover adds after the error completion."
    )


def main() -> int:
    parser = arguments(__doc__.splitlines()[0], trials=10)
    parser.add_argument(
        "--settings",
        default=f"{DEFAULT[0]}:{DEFAULT[1]},{NCCL[0]}:{NCCL[1]}",
        help="the application's timeout:retry_cnt,... (default 14:7,20:7: the verbs' and NCCL's)",
    )
    args = parser.parse_args()
    settings = [tuple(int(x) for x in s.split(":")) for s in args.settings.split(",")]
    results: dict[tuple[int, int], list[float]] = {}
    with lab_for(args) as lab:
        for timeout, retry_cnt in settings:
            results[(timeout, retry_cnt)] = trials(lab, timeout, retry_cnt, args.trials)
    print(file=sys.stderr)
    print_table(results)
    save(args, {f"{t}:{r}": samples for (t, r), samples in results.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
