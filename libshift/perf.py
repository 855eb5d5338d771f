"""shift-perf: perftest-style benchmarks of a libshift device, with the machine's own limit beside each row.

Run a server on one host and a client on the other, as with ib_write_bw:

    shift-perf write_bw -d mlx5_0                 # server
    shift-perf write_bw -d mlx5_0 198.18.0.10     # client: the server's device address

Besides the verbs test, the same run measures a plain TCP stream and a plain TCP ping-pong between the same
two addresses (same netdevs, same namespaces), in C, so every row carries its ratio to what the machine can
do: bandwidth / raw stream bandwidth, latency / raw ping-pong half round trip. The client prints the table.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from libshift.core import _core
from libshift.device import find_device
from libshift.gid import ipv4_of_gid
from libshift.netns import NetnsError, in_netns
from libshift.verbs import (
    CQ,
    MR,
    PD,
    QP,
    SGE,
    CompChannel,
    Context,
    Endpoint,
    QPAttr,
    QPCap,
    QPInitAttr,
    RecvWR,
    SendWR,
    VerbsError,
)
from libshift.verbs import enums as e

TESTS = ("send_bw", "write_bw", "read_bw", "send_lat", "write_lat")
ALL_ACCESS = e.ALL_ACCESS
DEPTH = 128  # outstanding work requests in the bandwidth tests, as perftest's tx-depth
SIGNAL_EVERY = 16
RAW_CHUNK = 1 << 20
BYTES_PER_SIZE = 256 << 20


@dataclass
class Row:
    test: str
    size: int
    iterations: int
    value: float  # bytes/s for *_bw, seconds (half round trip) for *_lat
    limit: float  # the raw TCP figure it is compared with
    ratio: float


class Control:
    """The out-of-band channel (plain TCP, JSON lines) on which the two sides exchange endpoints and steps."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.file = sock.makefile("rwb")

    def send(self, **message: Any) -> None:
        self.file.write(json.dumps(message).encode() + b"\n")
        self.file.flush()

    def recv(self) -> dict[str, Any]:
        line = self.file.readline()
        if not line:
            raise ConnectionError("the other side closed the control connection")
        return json.loads(line)


class Side:
    """This host's verbs resources for one test: a QP, one MR of the largest size, a CQ with a channel."""

    def __init__(self, ctx: Context, mr_size: int, busy_poll: bool = False) -> None:
        self.busy_poll = busy_poll
        self.pd = PD(ctx)
        self.channel = CompChannel(ctx)
        self.cq = CQ(ctx, 4 * DEPTH + 16, channel=self.channel)
        cap = QPCap(max_send_wr=2 * DEPTH, max_recv_wr=2 * DEPTH, max_inline_data=64)
        self.qp = QP(self.pd, QPInitAttr(scq=self.cq, rcq=self.cq, cap=cap))
        self.mr = MR(self.pd, mr_size, ALL_ACCESS)

    def connect(self, ctrl: Control) -> dict[str, Any]:
        """Swap endpoints and MR coordinates with the peer and bring the QP to RTS; the peer's MR info."""
        ctrl.send(endpoint=self.qp.endpoint().to_json(), addr=self.mr.buf, rkey=self.mr.rkey)
        peer = ctrl.recv()
        self.qp.connect(
            Endpoint.from_json(peer["endpoint"]), QPAttr(qp_access_flags=ALL_ACCESS, min_rnr_timer=1)
        )
        ctrl.send(ready=True)
        ctrl.recv()
        return peer

    def wait(self, minimum: int = 1) -> list[Any]:
        """At least `minimum` completions, sleeping on the completion channel (perftest's -e) unless
        busy_poll; any error ends the run. Either way this thread reads the sockets itself: a poll of an
        empty CQ makes a pass, a channel wait waits on the sockets (docs/core.md, Speed)."""
        got: list[Any] = []
        while len(got) < minimum:
            if not self.busy_poll:
                self.cq.req_notify()  # armed before the poll, which catches what came before: one poll a wait
            got += self.cq.poll(DEPTH)[1]
            if len(got) < minimum and not self.busy_poll:
                try:
                    self.channel.get_cq_event(timeout=30)
                except TimeoutError:
                    raise VerbsError("no completion within 30 s") from None
        bad = [wc for wc in got if wc.status != e.IBV_WC_SUCCESS]
        if bad:
            raise VerbsError(f"work request failed: {e.ibv_wc_status(bad[0].status).name}")
        return got

    def sge(self, size: int) -> list[SGE]:
        return [SGE(self.mr.buf, size, self.mr.lkey)]

    def close(self) -> None:
        for obj in (self.qp, self.mr, self.cq, self.channel, self.pd):
            obj.close()


def _stream(side: Side, iters: int, make: Callable[[int], SendWR]) -> float:
    """Post `iters` requests, DEPTH in flight; the seconds from the first post to the last completion."""
    start = time.perf_counter()
    posted = done = 0
    while done < iters:
        while posted < iters and posted - done < DEPTH:
            wr = make(posted)
            last = posted == iters - 1
            wr.send_flags = e.IBV_SEND_SIGNALED if (posted + 1) % SIGNAL_EVERY == 0 or last else 0
            side.qp.post_send(wr)
            posted += 1
        for wc in side.wait():
            done = wc.wr_id + 1
    return time.perf_counter() - start


def client_bw(test: str, side: Side, peer: dict[str, Any], size: int, iters: int) -> float:
    op = {"send_bw": e.IBV_WR_SEND, "write_bw": e.IBV_WR_RDMA_WRITE, "read_bw": e.IBV_WR_RDMA_READ}[test]

    def make(n: int) -> SendWR:
        return SendWR(wr_id=n, opcode=op, sg=side.sge(size), remote_addr=peer["addr"], rkey=peer["rkey"])

    return size * iters / _stream(side, iters, make)


def server_send_bw(side: Side, size: int, iters: int) -> None:
    """Keep receives posted until `iters` messages have landed."""
    for n in range(min(2 * DEPTH, iters)):
        side.qp.post_recv(RecvWR(wr_id=n, sg=side.sge(size)))
    posted, landed = min(2 * DEPTH, iters), 0
    while landed < iters:
        for _ in side.wait():
            landed += 1
            if posted < iters:
                side.qp.post_recv(RecvWR(wr_id=posted, sg=side.sge(size)))
                posted += 1


def pingpong(test: str, side: Side, peer: dict[str, Any], size: int, iters: int, first: bool) -> float:
    """Half round trip: each side answers the other's message. The same two work requests are posted again
    and again, as perftest does (building one is the application's cost, not the transport's); write_lat
    uses WRITE_WITH_IMM so that the receiver learns of the write from a completion, not by reading memory."""
    op = e.IBV_WR_SEND if test == "send_lat" else e.IBV_WR_RDMA_WRITE_WITH_IMM
    flags = e.IBV_SEND_INLINE if size <= 64 else 0
    send = SendWR(opcode=op, sg=side.sge(size), send_flags=flags, remote_addr=peer["addr"], rkey=peer["rkey"])
    # The receive spans the whole MR: the one left posted at the end of a size step must hold the
    # larger messages of the next step (-a), as a perftest receive buffer does.
    recv = RecvWR(sg=side.sge(side.mr.length))
    post_send, post_recv, wait = side.qp.post_send, side.qp.post_recv, side.wait
    post_recv(recv)
    start = time.perf_counter()
    for _ in range(iters):
        if first:
            post_send(send)
        post_recv(recv)
        while not any(wc.opcode & e.IBV_WC_RECV for wc in wait()):
            pass
        if not first:
            post_send(send)
    return (time.perf_counter() - start) / (2 * iters)


def raw_stream(sock: socket.socket, total: int, sending: bool) -> float:
    """A plain TCP stream of `total` bytes in RAW_CHUNK writes; bytes/s as the sender sees it, acked.
    In C (libshift.core), as iperf3's: the baseline is the machine's TCP, not the interpreter."""
    return _core.raw_stream(sock.fileno(), total, RAW_CHUNK, sending)


def raw_pingpong(sock: socket.socket, iters: int, first: bool) -> float:
    """Half round trip of 8-byte messages over a plain TCP socket (TCP_NODELAY), in C as qperf's."""
    return _core.raw_pingpong(sock.fileno(), 8, iters, first)


def sizes(args: argparse.Namespace) -> list[int]:
    return [1 << k for k in range(3, 23)] if args.all else [args.size]


def iterations(args: argparse.Namespace, test: str, size: int) -> int:
    if args.iters:
        return args.iters
    if test.endswith("_lat"):
        return 2000
    return max(200, min(20000, BYTES_PER_SIZE // size))


def device_address(ctx: Context) -> str:
    """The device's IPv4 address, from its IPv4-mapped GID: where raw baselines listen."""
    return ipv4_of_gid(ctx.query_gid())


def device_socket(ctx: Context) -> socket.socket:
    """A plain TCP socket on the device's netdev and in its namespace, for control and raw baselines."""
    with in_netns(ctx.device.netns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, ctx.device.netdev.encode())
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def run(args: argparse.Namespace) -> list[Row]:
    find_device(args.device)  # a clear one-line error before anything else
    ctx = Context(name=args.device)
    address = device_address(ctx)
    try:
        if args.address is None:
            listener = device_socket(ctx)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((address, args.port))
            listener.listen(2)
            print(
                f"shift-perf: waiting on {address}:{args.port} ({args.test}, device {args.device})",
                flush=True,
            )
            ctrl_sock, _ = listener.accept()
            raw_sock, _ = listener.accept()
            listener.close()
        else:
            ctrl_sock, raw_sock = device_socket(ctx), device_socket(ctx)
            ctrl_sock.connect((args.address, args.port))
            raw_sock.connect((args.address, args.port))
        return session(args, ctx, Control(ctrl_sock), raw_sock, client=args.address is not None)
    finally:
        ctx.close()


def session(
    args: argparse.Namespace, ctx: Context, ctrl: Control, raw: socket.socket, client: bool
) -> list[Row]:
    """Both sides walk the same steps; the client decides the sizes and reports."""
    plan = ctrl.recv() if not client else {"sizes": sizes(args)}
    if client:
        ctrl.send(**plan)
    raw_total = 512 << 20
    stream_bw = raw_stream(raw, raw_total, sending=client)
    half_rtt = raw_pingpong(raw, 5000, first=client)
    side = Side(ctx, max(plan["sizes"]), busy_poll=args.busy_poll)
    rows = []
    try:
        peer = side.connect(ctrl)
        for size in plan["sizes"]:
            iters = iterations(args, args.test, size)
            if args.test.endswith("_lat"):
                value = pingpong(args.test, side, peer, size, iters, first=client)
                rows.append(Row(args.test, size, iters, value, half_rtt, value / half_rtt))
            elif client:
                value = client_bw(args.test, side, peer, size, iters)
                rows.append(Row(args.test, size, iters, value, stream_bw, value / stream_bw))
            elif args.test == "send_bw":
                server_send_bw(side, size, iters)
            ctrl.send(done=size)
            ctrl.recv()
    finally:
        side.close()
    return rows


def table(rows: list[Row]) -> str:
    lines = [f"{'test':<10} {'bytes':>9} {'iters':>6} {'result':>14} {'raw TCP':>14} {'ratio':>6}"]
    for r in rows:
        if r.test.endswith("_bw"):
            result, limit = f"{r.value / 1e6:9.1f} MB/s", f"{r.limit / 1e6:9.1f} MB/s"
        else:
            result, limit = f"{r.value * 1e6:11.1f} us", f"{r.limit * 1e6:11.1f} us"
        lines.append(f"{r.test:<10} {r.size:>9} {r.iterations:>6} {result:>14} {limit:>14} {r.ratio:6.2f}")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="shift-perf",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "tests: send_bw, write_bw, read_bw (bandwidth with 128 requests in flight),\n"
            "       send_lat, write_lat (half round trip of a ping-pong).\n"
            "Without ADDRESS it is the server; with it, the client, which prints the results.\n"
            "The ratio column is result / raw TCP: for bandwidth higher is better (1.0 = the raw stream),\n"
            "for latency lower is better (1.0 = the raw ping-pong's half round trip).\n"
            "tcp devices come from SHIFT_TCP_DEVICES or the [devices] table of SHIFT_CONFIG."
        ),
    )
    p.add_argument("test", choices=TESTS, help="which benchmark to run")
    p.add_argument("address", nargs="?", help="the server's device address (client only)")
    p.add_argument("-d", "--device", required=True, help="the libshift device to use, e.g. mlx5_0")
    p.add_argument(
        "-s", "--size", type=int, help="message size in bytes (default 8 for *_lat, 65536 for *_bw)"
    )
    p.add_argument("-a", "--all", action="store_true", help="all sizes from 8 B to 4 MiB")
    p.add_argument("-n", "--iters", type=int, default=0, help="iterations per size (default: by size)")
    p.add_argument("-p", "--port", type=int, default=18515, help="control port (default 18515)")
    p.add_argument(
        "--busy-poll", action="store_true", help="poll the CQ in a loop instead of sleeping on its channel"
    )
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_intermixed_args(argv)
    if args.size is None:
        args.size = 8 if args.test.endswith("_lat") else 65536
    if args.size <= 0:
        print("shift-perf: --size must be positive", file=sys.stderr)
        return 2
    try:
        rows = run(args)
    except (VerbsError, NetnsError, OSError, ConnectionError) as exc:
        print(f"shift-perf: {exc}", file=sys.stderr)
        return 1
    if args.address is not None:
        print(json.dumps([asdict(r) for r in rows], indent=1) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
