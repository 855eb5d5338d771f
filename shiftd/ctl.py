"""`shiftctl`: the operator's CLI for shiftd (status, NICs, events, fault injection).

Every failure a user can cause (no daemon, no permission, unknown device, a fault's bad
parameter) is one line on stderr and a non-zero exit (2 for a mistake in the arguments);
tracebacks are for bugs only.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from collections.abc import Iterable

import grpc
from google.protobuf import json_format

from libshift.api.shift.v1 import admin_pb2, admin_pb2_grpc, common_pb2
from shiftd import __version__
from shiftd.fault_spec import Fault, FaultSpecError, parse_loss, parse_rate
from shiftd.nic import FaultMode

DEFAULT_SOCKET = "/run/shift/shiftd.sock"
MODES = {"down": FaultMode.DOWN, "blackhole": FaultMode.BLACKHOLE, "flap": FaultMode.FLAP,
         "lossy": FaultMode.LOSSY, "slow": FaultMode.SLOW}  # fmt: skip
MODES_HELP = """\
modes:
  down       the link is set down: its peer loses carrier
  blackhole  link and carrier stay up, every packet is dropped, both ways (tc)
  flap       the link goes down and up every --period seconds until recovered
  lossy      link and carrier stay up, each packet is dropped with the chance --loss,
             both ways (tc, random)
  slow       link and carrier stay up, what the NIC sends is limited to --rate (tc tbf)

shiftd says the NIC is DOWN under the first three (agents move its traffic to a backup at
once) and DEGRADED under lossy and slow (the traffic stays and meets the gray failure; no
failback onto the NIC until it is recovered). `shiftctl recover-nic DEVICE` removes any of
them. Examples:
  shiftctl fail-nic mlx5_0 --mode lossy --loss 5%
  shiftctl fail-nic mlx5_0 --mode slow --rate 100mbit
  shiftctl fail-nic mlx5_0 --mode flap --period 0.5"""
NEEDS = {"lossy": ("loss", "5%"), "slow": ("rate", "100mbit")}  # the flag each mode needs, and an example
EXIT_ERROR = 1
EXIT_USAGE = 2


class CtlError(Exception):
    """One line for the operator."""


def state_name(state: int) -> str:
    return common_pb2.NicState.Name(state).removeprefix("NIC_STATE_")


def fault_name(mode: int) -> str:
    return common_pb2.FaultMode.Name(mode).removeprefix("FAULT_MODE_").lower().replace("unspecified", "-")


def to_dict(message) -> dict:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def timestamp(unix_nanos: int) -> str:
    when = datetime.datetime.fromtimestamp(unix_nanos / 1e9, datetime.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def format_table(header: list[str], rows: Iterable[list[str]]) -> str:
    rows = [header, *rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def format_nics(nics: Iterable[common_pb2.Nic]) -> str:
    header = ["DEVICE", "NETDEV", "PROVIDER", "STATE", "REASON", "LINK", "CARRIER", "FAULT", "PENALTY", "GID"]
    rows = [
        [
            n.device,
            n.netdev,
            n.provider,
            state_name(n.state),
            n.reason,
            "up" if n.admin_up else "down",
            "yes" if n.carrier else "no",
            fault_name(n.fault),
            f"{n.flap_penalty:.0f}",
            n.gid or "-",
        ]
        for n in nics
    ]
    return format_table(header, rows)


def format_event(event: admin_pb2.Event) -> str:
    head = f"{timestamp(event.time_unix_nanos)} {event.host} #{event.seq}"
    kind = event.WhichOneof("kind")
    if kind == "nic":
        n = event.nic
        change = f"{state_name(n.previous_state)} -> {state_name(n.state)}"
        return f"{head} nic {n.device} ({n.netdev}) {change} {n.reason}"
    if kind == "fault":
        f = event.fault
        what = f"injected {fault_name(f.mode)}" if f.mode else "cleared"
        return f"{head} fault {f.device} {what}"
    if kind == "agent":
        a = event.agent
        verb = "registered" if a.registered else "left"
        return f"{head} agent {a.agent.agent_id} {verb} (pid {a.agent.pid}, {a.agent.name or '?'})"
    if kind == "failover":
        r = event.failover
        what = "failback" if r.kind == common_pb2.FAILOVER_KIND_FAILBACK else "failover"
        return (
            f"{head} {what} {r.device} -> {r.backup_device} reason={r.reason} "
            f"downtime={r.downtime_seconds * 1e3:.2f}ms qps={r.qps} reposted={r.reposted_work_requests}"
        )
    return f"{head} (unknown event)"


def format_status(s: admin_pb2.StatusResponse) -> str:
    etcd = "connected" if s.etcd_connected else "UNREACHABLE"
    lines = [
        f"host:      {s.host}",
        f"version:   shiftd {s.version}, up {s.uptime_seconds:.0f}s",
        f"socket:    {s.socket}",
        f"metrics:   {s.metrics_address or 'off'}",
        f"udev:      {s.udev}",
        f"etcd:      {etcd} ({', '.join(s.etcd_endpoints)}), lease {s.lease_id:x}, "
        f"{s.pending_writes} writes pending",
        f"agents:    {len(s.agents)}",
        f"failovers: {s.failovers}, failbacks: {s.failbacks}",
        "",
        format_nics(s.nics),
    ]
    for agent in s.agents:
        lines.append(
            f"agent {agent.agent_id}: pid {agent.pid} {agent.name} "
            f"qps={agent.qp_mappings} mrs={agent.mr_mappings} on_backup={agent.qps_on_backup}"
            + (f" reports_dropped={agent.reports_dropped}" if agent.reports_dropped else "")
        )
    return "\n".join(lines)


class Client:
    def __init__(self, socket_path: str, timeout: float) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        # A connection of its own: shiftd checks the caller on each connection (SO_PEERCRED).
        self._channel = grpc.insecure_channel(
            f"unix:{socket_path}", options=[("grpc.use_local_subchannel_pool", 1)]
        )
        self.admin = admin_pb2_grpc.AdminStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def check_reachable(self) -> None:
        if not os.path.exists(self.socket_path):
            raise CtlError(
                f"no shiftd socket at {self.socket_path} (is shiftd running? use --socket or SHIFT_SOCKET)"
            )
        if not os.access(self.socket_path, os.R_OK | os.W_OK):
            raise CtlError(f"permission denied on {self.socket_path}: run as root or join the socket's group")

    def explain(self, exc: grpc.RpcError) -> CtlError:
        code, details = exc.code(), exc.details() or ""
        if code == grpc.StatusCode.UNAVAILABLE:
            return CtlError(f"cannot reach shiftd at {self.socket_path}: {details}")
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return CtlError(f"shiftd at {self.socket_path} did not answer within {self.timeout:g}s")
        if code == grpc.StatusCode.PERMISSION_DENIED:
            return CtlError(f"permission denied: {details}")
        if code in (
            grpc.StatusCode.NOT_FOUND,
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.FAILED_PRECONDITION,
        ):
            return CtlError(details)
        return CtlError(f"{code.name.lower()}: {details}")


def cmd_status(client: Client, args: argparse.Namespace) -> None:
    reply = client.admin.Status(admin_pb2.StatusRequest(), timeout=client.timeout)
    print(json.dumps(to_dict(reply), indent=2) if args.json else format_status(reply))


def cmd_nics(client: Client, args: argparse.Namespace) -> None:
    reply = client.admin.ListNics(admin_pb2.ListNicsRequest(), timeout=client.timeout)
    print(json.dumps([to_dict(n) for n in reply.nics], indent=2) if args.json else format_nics(reply.nics))


def cmd_events(client: Client, args: argparse.Namespace) -> None:
    request = admin_pb2.StreamEventsRequest(backlog=args.backlog, follow=args.follow)
    stream = client.admin.StreamEvents(request, timeout=None if args.follow else client.timeout)
    for event in stream:
        print(json.dumps(to_dict(event)) if args.json else format_event(event), flush=True)


def fault_of(args: argparse.Namespace) -> Fault:
    """The fault fail-nic's arguments ask for, checked before any call: a mistake is one line."""
    if args.mode in NEEDS and getattr(args, NEEDS[args.mode][0]) is None:
        flag, example = NEEDS[args.mode]
        raise FaultSpecError(f"--mode {args.mode} needs --{flag} (e.g. --{flag} {example})")
    loss = 0.0 if args.loss is None else parse_loss(args.loss)
    rate = 0 if args.rate is None else parse_rate(args.rate)
    return Fault(MODES[args.mode], args.period or None, loss, rate)


def cmd_fail_nic(client: Client, args: argparse.Namespace) -> None:
    fault = args.fault
    request = admin_pb2.FailNicRequest(
        device=args.device,
        mode=int(fault.mode),
        flap_period_seconds=fault.period or 0.0,
        loss_percent=fault.loss_percent,
        rate_bits_per_second=fault.rate_bits,
    )
    nic = client.admin.FailNic(request, timeout=client.timeout).nic
    state = f"state {state_name(nic.state)} ({nic.reason})"
    print(f"{nic.device} ({nic.netdev}): {fault.describe()} injected; {state}")


def cmd_recover_nic(client: Client, args: argparse.Namespace) -> None:
    nic = client.admin.RecoverNic(admin_pb2.RecoverNicRequest(device=args.device), timeout=client.timeout).nic
    print(f"{nic.device} ({nic.netdev}): fault cleared; state {state_name(nic.state)} ({nic.reason})")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shiftctl",
        description="Operate shiftd, the SHIFT daemon of this host: show NICs and events, inject NIC faults.",
        epilog="Admin commands need root or the admin group of shiftd (server.admin_group).",
    )
    parser.add_argument(
        "--socket",
        default=os.environ.get("SHIFT_SOCKET", DEFAULT_SOCKET),
        help=f"shiftd's Unix socket (default: $SHIFT_SOCKET or {DEFAULT_SOCKET})",
    )
    parser.add_argument(
        "--timeout", type=float, default=5.0, help="seconds to wait for an answer (default 5)"
    )
    parser.add_argument("--version", action="version", version=f"shiftctl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("status", help="the daemon, etcd, NICs and agents at a glance")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("nics", help="the NICs and their health")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_nics)

    p = sub.add_parser("events", help="recent NIC, fault, agent and failover events")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new events until interrupted")
    p.add_argument(
        "--backlog", type=int, default=100, help="how many past events to show first (default 100)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object per line")
    p.set_defaults(func=cmd_events)

    p = sub.add_parser(
        "fail-nic",
        help="inject a real fault on a NIC: link down, black hole, flapping, packet loss or a rate limit",
        description="Inject a real fault on a NIC's link, in the kernel (netlink and tc), until recover-nic.",
        epilog=MODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("device", help="RDMA device name, e.g. mlx5_0")
    p.add_argument("--mode", choices=list(MODES), default="down", help="kind of fault (default down)")
    p.add_argument(
        "--period",
        type=float,
        default=0.0,
        metavar="S",
        help="flap: seconds of one down-and-up cycle (default: faults.flap_period_seconds of shiftd)",
    )
    p.add_argument(
        "--loss",
        metavar="PERCENT",
        help="lossy: the chance that a packet is dropped, e.g. 5%% or 0.5%% (more than 0, less than 100)",
    )
    p.add_argument(
        "--rate",
        metavar="RATE",
        help="slow: bits per second the NIC may send, in tc's units: e.g. 100mbit, 2.5gbit (1kbit to 10tbit)",
    )
    p.set_defaults(func=cmd_fail_nic)

    p = sub.add_parser("recover-nic", help="remove an injected fault, whichever it is")
    p.add_argument("device", help="RDMA device name, e.g. mlx5_0")
    p.set_defaults(func=cmd_recover_nic)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "backlog", 0) < 0:
        print("shiftctl: --backlog must not be negative", file=sys.stderr)
        return EXIT_USAGE
    if args.func is cmd_fail_nic:
        try:
            args.fault = fault_of(args)
        except FaultSpecError as exc:
            print(f"shiftctl: {exc}", file=sys.stderr)
            return EXIT_USAGE
    client = Client(args.socket, args.timeout)
    try:
        client.check_reachable()
        args.func(client, args)
    except grpc.RpcError as exc:
        print(f"shiftctl: {client.explain(exc)}", file=sys.stderr)
        return EXIT_ERROR
    except CtlError as exc:
        print(f"shiftctl: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
