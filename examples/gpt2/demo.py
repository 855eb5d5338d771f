"""`make demo`: GPT-2 trained with DDP across a lab, a NIC failed and recovered under it, and a report.

Brings up a lab (hosts x NICs, etcd, one shiftd per host), runs the job with `shiftctl fail-nic` on
one host partway through and `recover-nic` later, runs it again without a failure for the reference
weights, prints the report (report.py), draws the PNG and takes the lab down, also on Ctrl-C.
Exit status 0 only when the run survived the failure with the reference's final weights.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import report
import scenario
from job import JobSpec
from model import PRESETS
from records import ShiftctlError

from shiftlab.etcdproc import EtcdError
from shiftlab.fabric import FabricError
from shiftlab.lab import Lab, LabError
from shiftlab.netns import NetnsError


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="GPT-2 with DDP on a lab fabric through a NIC failure and back.")
    p.add_argument("--name", default="demo", help="lab name (default demo)")
    p.add_argument("--hosts", type=int, default=2, help="hosts, one rank each (default 2)")
    p.add_argument("--nics", type=int, default=2, help="NICs per host (default 2)")
    p.add_argument("--backend", default="shift", help="torch.distributed backend (default shift)")
    p.add_argument("--model", choices=sorted(PRESETS), default="small", help="model size (default small)")
    p.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    p.add_argument("--fail-host", default="h0", help="host whose NIC fails (default h0)")
    p.add_argument("--device", default="mlx5_0", help="the NIC that fails (default mlx5_0)")
    p.add_argument("--mode", choices=("down", "blackhole"), default="down", help="the fault (default down)")
    p.add_argument("--out", type=Path, default=Path("demo-out"), help="output directory (default demo-out)")
    args = p.parse_args(argv)
    if args.steps < 20:
        p.error("--steps must be at least 20, to leave room before, during and after the failure")
    if args.hosts < 2:
        p.error("--hosts must be at least 2: one rank per host, and a failure needs a peer")
    return args


class Progress:
    """Lines prefixed with the seconds since the demo started, flushed at once."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self, message: str, indent: str = "    ") -> None:
        for line in message.splitlines():
            print(f"[{time.monotonic() - self.t0:6.1f}s] {indent}{line}", flush=True)

    def title(self, message: str) -> None:
        print(f"\n\033[1m== {message}\033[0m", flush=True)


def plan_for(args: argparse.Namespace) -> scenario.FaultPlan:
    """Fail at 1/3 of the run, recover at 2/3, and have the failback settled 5% before the end."""
    return scenario.FaultPlan(
        fail_step=args.steps // 3,
        recover_step=2 * args.steps // 3,
        settle_step=args.steps - max(2, args.steps // 20),
        host=args.fail_host,
        device=args.device,
        mode=args.mode,
    )


def demo(args: argparse.Namespace, show: Progress) -> bool:
    lab = Lab(args.name, hosts=args.hosts, nics=args.nics)
    lab.index(args.fail_host)  # a clear error before anything is built
    spec = JobSpec(backend=args.backend, model=args.model, steps=args.steps)
    plan = plan_for(args)
    out = args.out.resolve()
    show.title(f"bringing up lab {args.name!r}: {args.hosts} hosts x {args.nics} NICs, etcd, shiftd per host")
    lab.up()
    try:
        show.title(f"training with a failure of {args.device} on {args.fail_host} (torchrun on every host)")
        failed = scenario.run(lab, spec, out / "with-failure", plan, show=show)
        show.title("training again without a failure: the reference weights")
        reference = scenario.run(lab, replace(spec, port=spec.port + 1), out / "reference", show=show)
    finally:
        show.title(f"taking lab {args.name!r} down")
        lab.down()
    show.title("report")
    text = report.summary(failed, reference, f"{args.hosts} hosts x {args.nics} NICs")
    png = report.plot(failed, reference, out / "gpt2-failover.png")
    (out / "report.txt").write_text(text + "\n")
    print(text)
    print(f"plot: {png}\nreport: {out / 'report.txt'}; logs under {out}")
    survived = failed.ok and reference.ok and report.weights_equal(failed, reference)
    verdict = "the job ran through the failure" if survived else "the job did NOT come through unchanged"
    show.title(f"demo finished: {verdict}")
    return survived


def on_term(main_pid: int) -> Callable[[int, object], None]:
    """A TERM handler that cleans up as Ctrl-C does (job stopped, lab down), in this process only: pyroute2
    forks helpers to enter namespaces and ends them with TERM, and a fork must not run our clean-up."""

    def handler(signum: int, frame: object) -> None:
        if os.getpid() != main_pid:
            os._exit(128 + signum)
        raise KeyboardInterrupt

    return handler


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, on_term(os.getpid()))
    try:
        return 0 if demo(args, Progress()) else 1
    except (LabError, FabricError, EtcdError, NetnsError, ShiftctlError, OSError, ValueError) as exc:
        print(f"demo: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        print("demo: interrupted", file=sys.stderr)
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
