"""What a link delivers, measured between two network namespaces: the share of a burst of UDP datagrams
that arrives, and the rate of one TCP stream. The gray faults' tests compare a faulted link with itself
unfaulted."""

from __future__ import annotations

import socket
import threading
import time

from shiftlab import netns

SO_RCVBUFFORCE = 33  # root may pass net.core.rmem_max: a burst must not overflow the receiver
BURST_BUFFER = 8 << 20
DATAGRAM = b"x" * 64
STREAM_CHUNK = 1 << 20


def udp_delivery(sender_ns: str, receiver_ns: str, address: str, count: int = 2000) -> float:
    """Send `count` datagrams from `sender_ns` to `address` in `receiver_ns`; the share that arrived."""
    receiver = netns.run(receiver_ns, socket.socket, socket.AF_INET, socket.SOCK_DGRAM)
    sender = netns.run(sender_ns, socket.socket, socket.AF_INET, socket.SOCK_DGRAM)
    with receiver, sender:
        receiver.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, BURST_BUFFER)
        receiver.bind((address, 0))
        target = receiver.getsockname()
        for _ in range(count):
            sender.sendto(DATAGRAM, target)
        received = 0
        receiver.settimeout(0.5)
        try:
            while received < count:
                receiver.recv(2048)
                received += 1
        except TimeoutError:
            pass
    return received / count


def tcp_rate(
    sender_ns: str, receiver_ns: str, address: str, seconds: float = 1.0, chunk_bytes: int = STREAM_CHUNK
) -> float:
    """Bits per second that one TCP stream from `sender_ns` delivered to `address` in `receiver_ns`,
    counted until the receiver has read everything (what waited in a queue is not counted as sent). It
    writes `chunk_bytes` a call, each within 5 s: over a lossy link, make them small."""
    server = netns.run(receiver_ns, socket.create_server, (address, 0))
    received = [0]

    def receive() -> None:
        connection, _ = server.accept()
        with connection:
            while data := connection.recv(STREAM_CHUNK):
                received[0] += len(data)

    with server:
        reader = threading.Thread(target=receive, daemon=True)
        reader.start()
        client = netns.run(sender_ns, socket.create_connection, server.getsockname(), 5.0)
        chunk = b"x" * chunk_bytes
        started = time.monotonic()
        with client:
            while time.monotonic() - started < seconds:
                client.sendall(chunk)
        reader.join(timeout=30)
        assert not reader.is_alive(), "the receiver did not see the stream end"
        return received[0] * 8 / (time.monotonic() - started)
