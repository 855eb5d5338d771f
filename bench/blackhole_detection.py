"""Black-hole detection: from a silent black hole on the path to resumed traffic on the backup NIC.

h0 streams SEND to h1 over one shift QP on a 2x2 lab. Each trial makes rail 0's switch drop everything
towards h1 (a root "blackhole" qdisc on its port; links and carrier stay up, so no shiftd sees anything) and
times, on CLOCK_MONOTONIC, from t0 (just before the netlink RTM_NEWQDISC is sent) to the sender's first
successful completion of a WR posted after t0. The only detection is the sender's ack deadline
(4.096 us x 2^timeout x (retry_cnt + 1), then RETRY_EXC_ERR), so each QP setting is a row: the verbs
defaults first (the target, under 100 ms, is for them), then the others asked for. NCCL's defaults
(NCCL_IB_TIMEOUT 20, NCCL_IB_RETRY_CNT 7) are shown computed, not run. Between trials the black hole is
removed and h0's switch port bounced, so shiftd's NIC DOWN/UP brings the QPs back onto mlx5_0.

    sudo .venv/bin/python bench/blackhole_detection.py [--trials 10] [--settings 14:7,12:3]
"""

from __future__ import annotations

import sys

from failover_lab import Pair, arguments, blackhole, bounce_port, lab_for, progress, save, summary

from libshift.providers.tcp.sender import ack_deadline
from libshift.verbs import QPAttr
from shiftd.lab import Lab

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
            bounce_port(lab, pair)  # shiftd's DOWN then UP: the failback onto mlx5_0
            pair.settle()
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
        f"{'QP setting':34} {'ack deadline':>12} {'trials':>6} {'median':>9} {'p99':>9} {'max':>9} "
        f"{'- deadline':>10}   target"
    )
    print(header)
    print("-" * len(header))
    for (timeout, retry_cnt), samples in results.items():
        deadline = ack_deadline(timeout, retry_cnt) * 1e3
        stats = summary(samples)
        label = f"timeout {timeout}, retry_cnt {retry_cnt}" + (
            " (default)" if (timeout, retry_cnt) == DEFAULT else ""
        )
        verdict = ""
        if (timeout, retry_cnt) == DEFAULT:
            verdict = f"median < {TARGET_MS:g} ms: {'met' if stats['median'] < TARGET_MS else 'MISSED'}"
        print(
            f"{label:34} {deadline:12.1f} {stats['n']:6d} {stats['median']:9.1f} {stats['p99']:9.1f} "
            f"{stats['max']:9.1f} {stats['median'] - deadline:10.1f}   {verdict}"
        )
    nccl = ack_deadline(*NCCL) * 1e3
    print(
        f"{'NCCL defaults (20, 7)':34} {nccl:12.1f} {'not run: the error alone comes after the deadline':>50}"
    )
    print("\n- deadline: median minus the ack deadline, i.e. what failover adds after the error completion.")


def main() -> int:
    parser = arguments(__doc__.splitlines()[0], trials=10)
    parser.add_argument(
        "--settings",
        default=f"{DEFAULT[0]}:{DEFAULT[1]},12:3",
        help="timeout:retry_cnt,... (default 14:7,12:3)",
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
