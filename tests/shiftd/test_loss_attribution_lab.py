"""Whose loss it is, on a lab of three hosts: rail 0's switch port towards h1 loses 10% of the packets both
ways, no shiftd told. h0 streams to h1 and to h2, h1 to h0. h0's traffic to h1 is lost, its traffic to h2
is not: h0's NIC is fine, and its shiftd must not call it lossy (before, the NIC's whole traffic losing
3-5% made it DEGRADED, 2 runs of 2). h1 loses towards its only peer: nothing tells the two apart there,
and its shiftd calls its NIC lossy, as it is.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from labs import running_lab

from libshift.api.shift.v1 import admin_pb2, common_pb2
from shiftd.ctl import Client
from shiftlab import netns
from shiftlab.lab import Lab
from shiftlab.switch import lossy_port

pytestmark = [pytest.mark.lab, pytest.mark.timeout(180)]

LOSS = 10.0
STREAM_SECONDS = 8.0
CHUNK = 16 << 10
PACE = 2_000_000  # bytes a second to h2: about 1,400 segments, 700 in the loss judge's window of 0.5 s
SO_MAX_PACING_RATE = 47  # <asm-generic/socket.h>; TCP paces itself by it (Linux 4.13)


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with running_lab("la", hosts=3, nics=1) as lab:
        yield lab


def nic_state(lab: Lab, host: str) -> tuple[str, str]:
    """The state and reason of `host`'s mlx5_0, as its shiftd says."""
    client = Client(str(lab.socket(host)), timeout=30.0)
    try:
        nics = client.admin.ListNics(admin_pb2.ListNicsRequest(), timeout=30).nics
    finally:
        client.close()
    nic = next(n for n in nics if n.device == "mlx5_0")
    return common_pb2.NicState.Name(nic.state), nic.reason


def stream(sender_ns: str, receiver_ns: str, address: str, seconds: float, pace: int = 0) -> None:
    """TCP for `seconds`, as fast as it goes or paced by the kernel at `pace` bytes a second (a clean peer's
    traffic of about the lossy one's volume: at full speed it would send a hundred times the lossy link's
    segments and drown its loss; paced by the kernel, it is steady whatever this process's threads get of
    the CPU). A write the lossy link stalls past its 5 s ends the stream early, quietly."""
    server = netns.run(receiver_ns, socket.create_server, (address, 0))
    with server:
        reader = threading.Thread(target=_drain, args=(server,), daemon=True)
        reader.start()
        with netns.run(sender_ns, socket.create_connection, server.getsockname(), 5.0) as client:
            if pace:
                client.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, pace)
            chunk, started = b"x" * CHUNK, time.monotonic()
            with contextlib.suppress(TimeoutError):
                while time.monotonic() - started < seconds:
                    client.sendall(chunk)
        reader.join(timeout=30)


def _drain(server: socket.socket) -> None:
    connection, _ = server.accept()
    with connection:
        while connection.recv(1 << 16):
            pass


def start(target: Callable[..., object], *args: object) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


def test_a_loss_towards_one_peer_is_the_peers_not_the_nics_that_sends_to_it(lab: Lab) -> None:
    """h0's paced stream to h2 runs first (a NIC talking to one peer only cannot tell whose loss it is:
    h0 would be judged on its stream to h1 alone), then the port loses and h0 and h1 stream to each other."""
    ns = {host: lab.namespace(host) for host in lab.host_names}
    address = {host: lab.shape.rail_address(0, lab.index(host)) for host in lab.host_names}
    seen: dict[str, set[tuple[str, str]]] = {host: set() for host in ("h0", "h1")}
    threads = [start(stream, ns["h0"], ns["h2"], address["h2"], STREAM_SECONDS + 2, PACE)]
    time.sleep(1.0)
    with lossy_port(lab, 0, "h1", LOSS):
        for a, b in (("h0", "h1"), ("h1", "h0")):  # small writes: each within 5 s over the lossy link
            threads.append(start(stream, ns[a], ns[b], address[b], STREAM_SECONDS))
        deadline = time.monotonic() + STREAM_SECONDS
        while time.monotonic() < deadline:
            for host, states in seen.items():
                states.add(nic_state(lab, host))
            time.sleep(0.2)
        for thread in threads:
            thread.join(timeout=60)
    assert ("NIC_STATE_DEGRADED", "retransmits") in seen["h1"], seen  # h1's only peer: its own NIC judged
    # h0's loss is towards h1 alone (h2's is clean). Not asked: the speed judge's word. The kernel's pacing
    # of the stream to h2 holds its bytes back as a slow path would, so both of h0's peers can look slow to
    # it; a loss verdict would show before it (health.py: the traffic's loss first)
    assert ("NIC_STATE_DEGRADED", "retransmits") not in seen["h0"], seen
    assert ("NIC_STATE_UP", "up") in seen["h0"], seen
