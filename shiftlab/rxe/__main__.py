"""`python -m shiftlab.rxe run [options] -- CMD...`: CMD inside a VM with four Soft-RoCE devices."""

from __future__ import annotations

import argparse
import signal
import sys

from shiftlab.rxe.host import RxeError
from shiftlab.rxe.vm import Job, run, stderr_log

RUNNER_FAILED = 125  # the VM could not run the command (as env(1) and docker do)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m shiftlab.rxe",
        description="Boot Debian's stock kernel under QEMU with four rxe devices (rxe0-rxe1 and "
        "rxe2-rxe3 are two veth links; even devices are one host's, odd ones the other's) and run a "
        "command there. The host's / is the guest's root, read-only; the command's output and exit "
        "code come back.",
    )
    sub = p.add_subparsers(dest="action", required=True)
    r = sub.add_parser("run", help="run a command in the VM; exits with its exit code (125: the VM failed)")
    r.add_argument(
        "--timeout", type=float, default=Job.timeout, help="seconds for the whole run (%(default)s)"
    )
    r.add_argument("--boot-timeout", type=float, default=Job.boot_timeout, help="seconds to reach init")
    r.add_argument("--accel", choices=("auto", "kvm", "tcg"), default="auto",
                   help="auto: KVM only where the CPU shows VT-x/AMD-V and it boots, else TCG")  # fmt: skip
    r.add_argument("--memory", default=Job.memory, help="guest memory (%(default)s)")
    r.add_argument("--no-check", action="store_true", help="skip the ib_write_bw/ib_send_lat sanity check")
    r.add_argument("--no-setup", action="store_true", help="no rxe devices (implies --no-check)")
    r.add_argument(
        "--no-install", action="store_true", help="fail instead of apt-get installing what is missing"
    )
    r.add_argument("-e", "--env", action="append", default=[], metavar="KEY=VALUE", help="set in the guest")
    r.add_argument("argv", nargs="+", metavar="CMD", help="the command (after --)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    env = dict(item.split("=", 1) for item in args.env)
    job = Job(
        argv=args.argv,
        env=env,
        setup=not args.no_setup,
        check=not (args.no_check or args.no_setup),
        timeout=args.timeout,
        boot_timeout=args.boot_timeout,
        accel=args.accel,
        memory=args.memory,
        install=not args.no_install,
    )
    # SIGTERM as ^C: the VM is powered off and its work share removed. Only for the run: a handler left
    # behind would outlive main() in a caller's process (a test's), and in every child it forks.
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        return run(job)
    except RxeError as exc:
        stderr_log(f"error: {exc}")
        return RUNNER_FAILED
    finally:
        signal.signal(signal.SIGTERM, previous)


def _terminated(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
