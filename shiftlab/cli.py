"""`shift-lab`: the command line over `Lab` (up, down, status, exec); every failure is one line on stderr."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from pyroute2.netlink.exceptions import NetlinkError

from shiftlab import fabric, netns
from shiftlab.etcdproc import EtcdError
from shiftlab.fabric import FabricError
from shiftlab.lab import DEFAULT_NAME, SHIFTD_ENV, Lab, LabError, name_flag, require_root


def _cmd_up(args: argparse.Namespace) -> int:
    lab = Lab(args.name, args.hosts, args.nics, etcd_members=args.etcd_members, provider=args.provider)
    lab.up()
    print(_describe(lab))
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    done = Lab(args.name).down()
    print("\n".join(done) if done else f"lab {args.name!r} is not up; nothing to do")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    try:
        lab = Lab.existing(args.name)
    except LabError:  # not up: status still reports leftovers, and an unreadable state again
        lab = Lab(args.name)
    status = lab.status()
    if args.json:
        print(json.dumps(status, indent=2))
    elif not status["up"]:
        leftovers = [ns for ns, ok in status["namespaces"].items() if ok]
        extra = f" (leftover namespaces: {', '.join(leftovers)}; run shift-lab down)" if leftovers else ""
        print(f"lab {args.name!r} is not up{extra}")
    else:
        print(_format_status(status))
    return 0 if status["healthy"] else 1


def _cmd_exec(args: argparse.Namespace) -> int:
    require_root()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    argv, env = Lab.existing(args.name).exec_command(args.host, command)
    sys.stdout.flush()
    os.execvpe(argv[0], argv, env)  # replaces this process, so CMD's exit status is ours


def _describe(lab: Lab) -> str:
    flag = name_flag(lab.name)
    lines = [
        f"lab {lab.name!r} is up: {lab.shape.hosts} hosts x {lab.shape.nics} NICs on {lab.shape.provider}"
        f" (state in {lab.state_dir})",
        f"  etcd  {', '.join(lab.etcd_endpoints)} in namespace {lab.shape.mgmt_ns}",
    ]
    for host in lab.host_names:
        where = f"namespace {lab.namespace(host)}" if lab.namespace(host) else "the initial namespace"
        devices = ", ".join(
            f"{dev}={netdev}" for dev, netdev in lab.shape.host_devices(lab.index(host)).items()
        )
        lines.append(f"  {host:<5} {where}, socket {lab.socket(host)}, {devices}")
    lines += [
        "try:",
        f"  shift-lab exec{flag} h0 -- shiftctl nics",
        f"  shift-lab status{flag}",
        f"  shift-lab down{flag}",
    ]
    return "\n".join(lines)


def _format_status(status: dict[str, Any]) -> str:
    def alive(rec: dict[str, Any]) -> str:
        return f"pid {rec['pid']} alive" if rec["alive"] else f"DEAD (pid {rec['pid']})"

    shape = status["shape"]
    health = "healthy" if status["healthy"] else "DEGRADED"
    provider = shape["provider"]
    lines = [f"lab {status['name']!r}: {shape['hosts']} hosts x {shape['nics']} NICs on {provider}, {health}"]
    namespaces = [f"{ns}{'' if ok else ' MISSING'}" for ns, ok in status["namespaces"].items()]
    lines.append(f"  namespaces: {', '.join(namespaces)}")
    for member in status["etcd"]["members"]:
        lines.append(f"  etcd   {member['endpoint']} ({member['name']}): {alive(member)}")
    for host, rec in status["hosts"].items():
        supervisor = rec["supervisor"]
        restarts = f", {rec['restarts']} restarts" if rec["restarts"] else ""
        lines.append(f"  {host:<6} shiftd {alive(rec)}, supervisor {alive(supervisor)}{restarts}")
        lines.append(f"         socket {rec['socket']}")
        nics = [f"{dev}={netdev} {rec['addresses'][netdev]}" for dev, netdev in rec["devices"].items()]
        mgmt = rec["mgmt_netdev"]
        lines.append(f"         {', '.join(nics)}, {mgmt} {rec['addresses'][mgmt]}")
    if keeper := status.get("route_keeper"):
        lines.append(f"  route keeper: {alive(keeper)}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shift-lab",
        description="A lab fabric for SHIFT: hosts as network namespaces with veth NICs on rail switches, "
        "etcd on a management network, and one shiftd per host. Needs root.",
    )
    sub = parser.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")

    def add(name: str, help: str, description: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=description)
        p.add_argument("--name", default=DEFAULT_NAME, help=f"lab name (default {DEFAULT_NAME})")
        return p

    up = add(
        "up",
        "build the fabric and start etcd and the daemons",
        "Build hosts NAME-h0.. with NICs ens1f0np0.. (RDMA names mlx5_0..) on rail switches NAME-rail0.., "
        "a management network NAME-mgmt with etcd on 198.19.0.1:2379 (--etcd-members 3: also .2 and .3), and "
        "start one shiftd per host under a supervisor that restarts it after a crash (as systemd's "
        "Restart=on-failure). Host i has 198.18.R.(10+i)/24 on rail R and 198.19.0.(10+i)/24 on mgmt0. "
        "Running it again reuses a lab of the same shape and restarts dead processes. "
        f"{SHIFTD_ENV} overrides the daemon command. With --provider rxe every NIC carries a Soft-RoCE "
        "device hI_rxeR (the kernel's rdma_rxe) and, as rxe on kernel 6.1 sends only from there, the NICs "
        "(hI-ens1f0np0..) and the hosts' processes stay in the initial namespace, with policy routing that "
        "`down` removes again.",
    )
    up.add_argument("--hosts", type=int, default=2, help="number of hosts (default 2)")
    up.add_argument("--nics", type=int, default=2, help="NICs per host, one rail each (default 2)")
    up.add_argument(
        "--etcd-members",
        type=int,
        default=1,
        help="etcd cluster size: 1, 3 or 5 members on 198.19.0.1, .2, ... (default 1)",
    )
    up.add_argument(
        "--provider",
        choices=fabric.PROVIDERS,
        default="tcp",
        help="tcp: libshift's RDMA over TCP (default); rxe: the kernel's Soft-RoCE, real verbs",
    )
    up.set_defaults(func=_cmd_up)

    down = add(
        "down",
        "stop the processes and remove the lab",
        "Stop the processes `up` started (SIGTERM, then SIGKILL; a shiftd stops with its supervisor), delete "
        "every namespace and link of the "
        "lab and its state directory. Safe to repeat, and after a failed `up`.",
    )
    down.set_defaults(func=_cmd_down)

    status = add(
        "status",
        "show the lab's shape, namespaces, processes and addresses",
        "Show the shape, which namespaces exist, whether each process is alive, sockets and addresses. "
        "Exits 0 when the lab is up and healthy, 1 otherwise.",
    )
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(func=_cmd_status)

    run = add(
        "exec",
        "run a command inside a host's namespace",
        "Run CMD inside HOST's namespace with SHIFT_SOCKET, SHIFT_CONFIG and SHIFT_HOST set for that host's "
        "shiftd; exits with CMD's status. Example: shift-lab exec h0 -- shiftctl nics",
    )
    run.add_argument("host", metavar="HOST", help="h0, h1, ...")
    run.add_argument(
        "command", metavar="-- CMD", nargs=argparse.REMAINDER, help="the command and its arguments"
    )
    run.set_defaults(func=_cmd_exec)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (LabError, FabricError, EtcdError, netns.NetnsError, OSError) as exc:
        print(f"shift-lab: {exc}", file=sys.stderr)
    except NetlinkError as exc:
        print(f"shift-lab: netlink error: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        print("shift-lab: interrupted", file=sys.stderr)
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
