"""What the failover benchmarks share: the lab, a stream between two lab hosts, real faults, timed.

A benchmark brings up a 2 hosts x 2 NICs lab (prefix "fb"), or uses a running one (--lab NAME), and runs
failover_peer.py on h0 (sender) and h1 (receiver). Faults are injected by this process with netlink
requests built in advance, and t0, the instant of a fault, is CLOCK_MONOTONIC just before the request is
sent: the clock every process of the machine shares, on which the peers time their completions.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import struct
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nic_event_latency import LinkSet, percentile, set_link

from shiftlab import netns
from shiftlab.etcdproc import EtcdError
from shiftlab.fabric import FabricError
from shiftlab.lab import Lab, LabError
from shiftlab.labproc import LabProcess, LabProcessError

PEER = str(Path(__file__).with_name("failover_peer.py"))
OUT = Path(__file__).with_name("out")
SETTLE = 0.3  # after a failback, before the next fault: the re-armed backup's handshake is done by then


def progress(message: str) -> None:
    print(f"\r{message}\033[K", end="", file=sys.stderr, flush=True)


def arguments(description: str, trials: int | None = None) -> argparse.ArgumentParser:
    """The options every failover benchmark has: --lab, --json (and --trials when it repeats)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--lab", help="use this running lab (2 hosts x 2 NICs) instead of building one")
    name = Path(sys.argv[0]).stem
    parser.add_argument("--json", type=Path, default=OUT / f"{name}.json", help="where the results go")
    if trials is not None:
        parser.add_argument("--trials", type=int, default=trials, help=f"trials (default {trials})")
    return parser


@contextlib.contextmanager
def lab_for(args: argparse.Namespace) -> Iterator[Lab]:
    """The lab named by --lab, or a fresh 2x2 one taken down at the end."""
    me = Path(sys.argv[0]).stem
    if os.geteuid() != 0:
        raise SystemExit(f"{me}: needs root (network namespaces)")
    try:
        if args.lab:
            lab = Lab.existing(args.lab)
            if (lab.shape.hosts, lab.shape.nics) != (2, 2):
                raise LabError(
                    f"lab {args.lab!r} has {lab.shape.hosts} hosts x {lab.shape.nics} NICs, not 2 x 2"
                )
        else:
            lab = Lab(f"fb{os.getpid() % 10000}", hosts=2, nics=2)
            progress(f"bringing up lab {lab.name} (2 hosts x 2 NICs)...")
            lab.up()
    except (LabError, FabricError, EtcdError) as exc:
        raise SystemExit(f"{me}: {exc}") from None
    try:
        yield lab
    except LabProcessError as exc:  # a peer failed: its stderr says why, a traceback would not
        raise SystemExit(f"{me}: {exc}") from None
    finally:
        if not args.lab:
            lab.down()


def save(args: argparse.Namespace, results: dict[str, Any]) -> None:
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1))


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "median": statistics.median(values),
        "p99": percentile(values, 99),
        "max": max(values),
    }


def start_peer(lab: Lab, host: str, args: list[str]) -> LabProcess:
    """failover_peer.py on a lab host, spoken to in JSON lines."""
    return LabProcess(lab, host, [sys.executable, PEER, *args])


class Pair:
    """A connected sender (h0) and receiver (h1): `with Pair(lab, "--mode", "send") as pair: ...`."""

    def __init__(self, lab: Lab, *args: str, connect_timeout: float = 120.0) -> None:
        self.sender = start_peer(lab, "h0", ["sender", *args])
        self.receiver = start_peer(lab, "h1", ["receiver", *args])
        try:
            ends = (
                self.sender.read("endpoints", connect_timeout),
                self.receiver.read("endpoints", connect_timeout),
            )
            self.sender.send(**ends[1])
            self.receiver.send(**ends[0])
            self.created = ends
            self.connected = (
                self.sender.read("connected", connect_timeout),
                self.receiver.read("connected", connect_timeout),
            )
        except BaseException:
            self.kill()
            raise

    def settle(self) -> None:
        """Wait until both sides are back on the default path with the backup armed."""
        for peer in (self.sender, self.receiver):
            answer = peer.ask("settled", settled=True)
            if not answer["settled"]:
                raise SystemExit(
                    f"{peer.host}: QPs did not settle on the default path: {answer['states']}; "
                    f"stderr (SHIFT_BENCH_LOG=INFO for more):\n{peer.stderr()}"
                )
        time.sleep(SETTLE)

    def stop(self, timeline: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
        sent = self.sender.ask("done", stop=True, timeline=timeline)
        received = self.receiver.ask("done", stop=True)
        for peer in (self.sender, self.receiver):
            peer.end()
        return sent, received

    def kill(self) -> None:
        for peer in (self.sender, self.receiver):
            peer.end(grace=0)

    def __enter__(self) -> Pair:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


# faults: each returns t0, CLOCK_MONOTONIC ns just before the kernel got the request


def switch_port(lab: Lab, host: str, up: bool, rail: int = 0) -> LinkSet:
    """Set `host`'s port on rail `rail`'s switch down or up: the host's NIC loses or regains carrier."""
    return set_link(lab.shape.rail_ns(rail), host, up)


RTM_NEWQDISC, RTM_DELQDISC = 36, 37
NLM_F_REQUEST, NLM_F_ACK, NLM_F_REPLACE, NLM_F_CREATE = 0x1, 0x4, 0x100, 0x400
TC_H_ROOT, TCA_KIND = 0xFFFFFFFF, 1


def _qdisc_request(index: int, add: bool) -> bytes:
    """RTM_NEWQDISC of a root "blackhole" qdisc (drops every packet it is given), or its RTM_DELQDISC."""
    body = struct.pack("=BxxxiIII", socket.AF_UNSPEC, index, 0, TC_H_ROOT, 0)
    if add:
        kind = b"blackhole\0"
        body += struct.pack("=HH", 4 + len(kind), TCA_KIND) + kind + b"\0" * (-len(kind) % 4)
        kind_flags, flags = RTM_NEWQDISC, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE
    else:
        kind_flags, flags = RTM_DELQDISC, NLM_F_REQUEST | NLM_F_ACK
    return struct.pack("=IHHII", 16 + len(body), kind_flags, flags, 1, 0) + body


def blackhole(lab: Lab, towards: str, on: bool, rail: int = 0) -> int:
    """Rail `rail`'s switch drops (on) or forwards again (off) everything towards `towards`; links stay up,
    so no shiftd sees anything: the gray failure only an ack deadline reveals. Returns the CLOCK_MONOTONIC
    time of the kernel's ack: the qdisc is in place by then (stamped before the request, a sample could
    count traffic that passed while a loaded machine's rtnl lock held the request back)."""

    def inside() -> int:
        request = _qdisc_request(socket.if_nametoindex(towards), on)
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
            sock.send(request)
            ack = sock.recv(4096)
            started = time.monotonic_ns()
        (error,) = struct.unpack_from("=i", ack, 16)
        if error:
            raise OSError(
                -error, f"blackhole {'on' if on else 'off'} towards {towards}: {os.strerror(-error)}"
            )
        return started

    return netns.run(lab.shape.rail_ns(rail), inside)
