"""The plain-TCP both-ways stream of bench/collectives_bw.py moves exactly its bytes each way and ends.

The bench's ceiling line rests on it, so it must neither stop short nor read past its count (which would
take the next test's bytes or hang). Over loopback between two threads; no lab needed.
"""

from __future__ import annotations

import importlib.util
import socket
import sys
import threading
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "collectives_bw.py"
sys.path.insert(0, str(BENCH.parent))  # the benches import each other
spec = importlib.util.spec_from_file_location("collectives_bw", BENCH)
assert spec is not None and spec.loader is not None
collectives_bw = importlib.util.module_from_spec(spec)
spec.loader.exec_module(collectives_bw)

TOTAL = 3 * collectives_bw.RAW_CHUNK + 12345  # a last chunk that is not whole
TRAILER = b"the next test's bytes"


def connected_pair(listener: socket.socket) -> tuple[socket.socket, socket.socket]:
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    return client, server


def test_raw_duplex_moves_exactly_its_bytes_both_ways_and_returns():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        a_out, b_in = connected_pair(listener)
        b_out, a_in = connected_pair(listener)
    errors: list[BaseException] = []

    def side(out: socket.socket, into: socket.socket) -> None:
        try:
            collectives_bw.raw_duplex(out, into, TOTAL)
            out.setblocking(True)
            out.sendall(TRAILER)  # what follows the stream on the wire stays unread by it
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=side, args=pair) for pair in ((a_out, a_in), (b_out, b_in))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    try:
        assert not any(thread.is_alive() for thread in threads), "raw_duplex did not end"
        assert errors == []
        for into in (a_in, b_in):
            into.setblocking(True)
            into.settimeout(5)
            assert into.recv(len(TRAILER), socket.MSG_WAITALL) == TRAILER
    finally:
        for sock in (a_out, a_in, b_out, b_in):
            sock.close()
