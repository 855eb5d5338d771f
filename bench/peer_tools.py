"""The peers' own tools, `qperf` and `iperf3`, on the netdevs shift uses, so a bench prints ratios to them.

The server runs inside one host's namespace (the far end of the link, e.g. the lab's h1 `mlx5_0`), the
client inside the other's, aimed at the server's rail address, for a second or so each:

    with VethPair("pt", "198.18.96") as fabric:
        peers = measure(*fabric.hosts)        # qperf tcp_lat (8 B), tcp_bw and iperf3 one stream (1 MiB)

`iperf3` binds both ends to the address and the netdev (SO_BINDTODEVICE); `qperf` cannot bind, so the
client's route to the server's address is checked to leave by the client's netdev. A server is always
ended by its PID when its client is done, also when anything failed. Times are in seconds and bandwidths in
bytes a second, as in shift-perf's rows. Kept beside the benches (not in shiftlab): it measures the
machine's TCP for a bench's baselines, it builds nothing of the lab.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from shiftlab import netns
from shiftlab.fabric import Shape
from shiftlab.lab import Lab
from shiftlab.pids import end
from shiftlab.veth import Host

QPERF_PORT = 19766  # qperf's synchronisation port (its default is 19765), the same on both ends
IPERF3_PORT = 5299
READY_TIMEOUT = 5.0
CLIENT_SLACK = 30.0  # beyond the test's own length: connecting, the tool's own start-up and report
LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp
TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "sec": 1.0}
RATE_UNITS = {"bytes/sec": 1.0, "KB/sec": 1e3, "MB/sec": 1e6, "GB/sec": 1e9}


class PeerToolError(RuntimeError):
    """A peer tool is missing, did not start or failed; str() is one line for the operator."""


class End(Protocol):
    """One host's end of the link: its namespace, the netdev shift uses there, that netdev's address."""

    @property
    def netns(self) -> str: ...
    @property
    def netdev(self) -> str: ...
    @property
    def address(self) -> str: ...


def lab_end(lab: Lab, host: str, device: str = "mlx5_0") -> Host:
    """`device` of lab host `host` as an End: the netdev and rail address shift's device there uses."""
    rails = list(lab.shape.devices())  # mlx5_0, mlx5_1, ...: rail r's device
    if device not in rails:
        raise PeerToolError(f"lab {lab.name} has no {device} (it has {', '.join(rails)})")
    r = rails.index(device)
    return Host(lab.namespace(host), Shape.netdev(r), Shape.rail_address(r, lab.index(host)))


@dataclass(frozen=True)
class Peers:
    """What the peers' tools measured on one link in one run."""

    tcp_lat: float  # qperf tcp_lat: half round trip, seconds
    tcp_bw: float  # qperf tcp_bw, bytes/s
    iperf3: float  # iperf3, one stream, bytes/s received
    lat_size: int
    bw_size: int


def measure(
    client: End, server: End, seconds: float = 1.0, lat_size: int = 8, bw_size: int = 1 << 20
) -> Peers:
    """qperf tcp_lat (`lat_size` B), tcp_bw and iperf3 one stream (`bw_size` B writes), `seconds` each."""
    lat, bw = qperf(client, server, seconds, lat_size, bw_size)
    return Peers(lat, bw, iperf3(client, server, seconds, bw_size), lat_size, bw_size)


def qperf(client: End, server: End, seconds: float, lat_size: int, bw_size: int) -> tuple[float, float]:
    """(tcp_lat seconds, tcp_bw bytes/s) of qperf's client on `client` against its server on `server`."""
    require("qperf")
    port = ["-lp", str(QPERF_PORT)]
    options = ["-t", f"{seconds:g}", "-ws", f"{READY_TIMEOUT:g}", "-uu"]  # -uu: ns and bytes/sec
    tests = ["-m", str(lat_size), "tcp_lat", "-m", str(bw_size), "tcp_bw"]  # -m applies to the next test
    check_route(client, server.address)
    with serving(server, ["qperf", *port], QPERF_PORT):
        out = run_client(client, ["qperf", server.address, *port, *options, *tests], 2 * seconds)
    results = parse_qperf(out)
    try:
        return scaled(results["tcp_lat"]["latency"], TIME_UNITS), scaled(results["tcp_bw"]["bw"], RATE_UNITS)
    except KeyError as exc:
        raise PeerToolError(f"qperf: no {exc} in its output: {out.strip()!r}") from None


def iperf3(client: End, server: End, seconds: float, length: int) -> float:
    """Bytes/s the server received of one iperf3 TCP stream of `length`-byte writes, for `seconds`."""
    require("iperf3")
    port = ["-p", str(IPERF3_PORT)]
    bind = ["--bind-dev", client.netdev, "-B", client.address]
    with serving(
        server, ["iperf3", "-s", "-1", "-B", server.address, "--bind-dev", server.netdev, *port], IPERF3_PORT
    ):
        out = run_client(
            client,
            ["iperf3", "-c", server.address, *port, *bind, "-t", f"{seconds:g}", "-l", str(length), "-J"],
            seconds,
        )
    try:
        return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 8
    except (ValueError, KeyError) as exc:
        raise PeerToolError(f"iperf3: no result in its JSON ({exc})") from None


def require(tool: str) -> None:
    if shutil.which(tool) is None:
        raise PeerToolError(
            f"{tool} is not installed: `make setup` installs it (scripts/ensure-system-deps.sh), "
            f"or apt-get install {tool}"
        )


def check_route(client: End, address: str) -> None:
    """The client's route to `address` leaves by its netdev: the tool measures the link shift uses."""
    got = subprocess.run(
        ["ip", "-n", client.netns, "-o", "route", "get", address], capture_output=True, text=True
    )
    dev = re.search(r"\bdev (\S+)", got.stdout)
    if got.returncode != 0 or dev is None or dev.group(1) != client.netdev:
        seen = dev.group(1) if dev else got.stderr.strip() or "no route"
        raise PeerToolError(f"{client.netns}: {address} is not reached by {client.netdev} ({seen})")


@contextlib.contextmanager
def serving(server: End, argv: Sequence[str], port: int) -> Iterator[None]:
    """`argv` as a server in `server`'s namespace, listening on `port` for the block; ended by its PID."""
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            netns.command(server.netns, argv), stdin=subprocess.DEVNULL, stdout=log, stderr=log, text=True
        )
        try:
            wait_listening(proc, argv[0], port, log)
            yield
        finally:
            end(proc, timeout=5.0)


def wait_listening(proc: subprocess.Popen[str], tool: str, port: int, log: IO[str]) -> None:
    """Until `proc` (exec'd by `ip netns exec` into `tool`) listens on `port` in its own namespace."""
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            said = " ".join(log.read().split())[-300:]
            raise PeerToolError(f"{tool} server ended (status {proc.returncode}): {said or 'no output'}")
        if listening(proc.pid, tool, port):
            return
        time.sleep(0.02)
    raise PeerToolError(f"{tool} server: not listening on port {port} after {READY_TIMEOUT:g} s")


def listening(pid: int, tool: str, port: int) -> bool:
    """`pid` is `tool` already (not `ip` before its exec) and has a TCP socket listening on `port`."""
    proc = Path(f"/proc/{pid}")
    try:
        if proc.joinpath("comm").read_text().strip() != tool:
            return False
        tables = [proc.joinpath("net", name).read_text() for name in ("tcp", "tcp6")]
    except OSError:
        return False
    for line in "".join(tables).splitlines()[1:]:
        fields = line.split()
        if len(fields) > 3 and fields[3] == LISTEN and fields[1].endswith(f":{port:04X}"):
            return True
    return False


def run_client(client: End, argv: Sequence[str], seconds: float) -> str:
    """`argv` in `client`'s namespace; its stdout, or a one-line error with what it said."""
    try:
        done = subprocess.run(
            netns.command(client.netns, argv), capture_output=True, text=True, timeout=seconds + CLIENT_SLACK
        )
    except subprocess.TimeoutExpired:
        raise PeerToolError(f"{argv[0]} client: no result within {seconds + CLIENT_SLACK:g} s") from None
    if done.returncode != 0:
        said = " ".join((done.stderr + done.stdout).split())[-300:]
        raise PeerToolError(f"{argv[0]} client (status {done.returncode}): {said or 'no output'}")
    return done.stdout


def parse_qperf(out: str) -> dict[str, dict[str, tuple[float, str]]]:
    """qperf's report, a test name and then `key = value unit` lines: {test: {key: (value, unit)}}."""
    results: dict[str, dict[str, tuple[float, str]]] = {}
    test = None
    for line in out.splitlines():
        if re.fullmatch(r"\w+:", line.strip()) and not line.startswith(" "):
            test = line.strip()[:-1]
            results[test] = {}
        elif test and (m := re.fullmatch(r"\s*(\w+)\s*=\s*([\d.]+)\s*(\S+)\s*", line)):
            results[test][m.group(1)] = (float(m.group(2)), m.group(3))
    return results


def scaled(value: tuple[float, str], units: dict[str, float]) -> float:
    number, unit = value
    if unit not in units:
        raise PeerToolError(f"qperf: unknown unit {unit!r}")
    return number * units[unit]
