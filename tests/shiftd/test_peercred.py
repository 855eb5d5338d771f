"""The SO_PEERCRED relay: a gRPC handler learns the real uid/pid of the caller behind it."""

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import grpc
import pytest

from shiftd.peercred import PeerCredRelay

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")

# Calls once as root (which also loads every module it needs from the venv), then drops to
# nobody and calls again on a new connection.
CLIENT = """
import grpc, os, sys
def who():
    # a connection of its own: a pooled one would still carry the root credentials
    with grpc.insecure_channel("unix:" + sys.argv[1], options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
        print(ch.unary_unary("/t.T/Who")(b"", timeout=10).decode(), flush=True)
who()
os.setgroups([])
os.setgid(65534)
os.setuid(65534)
who()
"""


async def _serve(tmp_path, seen):
    relay = None

    async def who(request, context):
        cred = relay.lookup(context.peer())
        seen.append(cred)
        return f"{cred.uid} {cred.pid}".encode() if cred else b"unknown"

    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler("t.T", {"Who": grpc.unary_unary_rpc_method_handler(who)})
    server.add_generic_rpc_handlers((handler,))
    private = tmp_path / "private.sock"
    server.add_insecure_port(f"unix:{private}")
    await server.start()
    closed = []
    relay = PeerCredRelay(str(tmp_path / "public.sock"), str(private), 0o666, "nogroup", closed.append)
    await relay.start()
    return server, relay, closed


def test_relay_reports_caller_uid_and_pid():
    workdir = Path(tempfile.mkdtemp(prefix="shift-peercred-"))
    os.chmod(workdir, 0o755)  # nobody must reach the public socket

    async def scenario():
        seen = []
        server, relay, closed = await _serve(workdir, seen)
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", CLIENT, str(workdir / "public.sock"), stdout=subprocess.PIPE
            )
            out, _ = await proc.communicate()
            assert proc.returncode == 0
            for _ in range(50):
                if len(closed) == 2:
                    break
                await asyncio.sleep(0.05)
            return out.decode().split("\n"), proc.pid, closed, relay.connections
        finally:
            await relay.close()
            await server.stop(None)

    try:
        lines, pid, closed, open_connections = asyncio.run(scenario())
    finally:
        shutil.rmtree(workdir)
    assert lines[0] == f"0 {pid}"
    assert lines[1] == f"65534 {pid}"
    assert len(closed) == 2 and all(c.startswith("unix-abstract:shiftd-") for c in closed)
    assert open_connections == 0


def test_direct_connection_to_private_socket_is_unknown(tmp_path):
    async def scenario():
        seen = []
        server, relay, _ = await _serve(tmp_path, seen)
        try:
            async with grpc.aio.insecure_channel(f"unix:{tmp_path / 'private.sock'}") as channel:
                return await channel.unary_unary("/t.T/Who")(b"", timeout=10)
        finally:
            await relay.close()
            await server.stop(None)

    assert asyncio.run(scenario()) == b"unknown"


def test_public_socket_mode(tmp_path):
    async def scenario():
        server, relay, _ = await _serve(tmp_path, [])
        mode = os.stat(tmp_path / "public.sock").st_mode & 0o777
        await relay.close()
        await server.stop(None)
        return mode, (tmp_path / "public.sock").exists()

    assert asyncio.run(scenario()) == (0o666, False)


class _Writer(asyncio.Protocol):
    """The far end of the relay, standing in for gRPC: writes when the test says so."""

    def __init__(self, connected: asyncio.Future) -> None:
        self.connected = connected

    def connection_made(self, transport):
        self.connected.set_result(transport)


@contextlib.asynccontextmanager
async def relay_to_writer(tmp_path):
    """A relay in front of a plain Unix server: a non-blocking client of it, and the server's transport."""
    loop = asyncio.get_running_loop()
    connected = loop.create_future()
    server = await loop.create_unix_server(lambda: _Writer(connected), str(tmp_path / "private.sock"))
    relay = PeerCredRelay(str(tmp_path / "public.sock"), str(tmp_path / "private.sock"), 0o600, "nogroup")
    await relay.start()
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.setblocking(False)
    try:
        await loop.sock_connect(client, str(tmp_path / "public.sock"))
        far_end = await asyncio.wait_for(connected, 10)
        while relay.connections == 0:  # joined once its credentials are known
            await asyncio.sleep(0.01)
        yield relay, client, far_end
    finally:
        client.close()
        await relay.close()
        server.close()


def test_pump_relays_what_is_waiting_without_a_turn_of_the_loop(tmp_path):
    """What gRPC wrote reaches the caller inside pump(), before the loop runs again; what comes later
    still goes the loop's way, after it and in order."""

    async def scenario():
        async with relay_to_writer(tmp_path) as (relay, client, far_end):
            far_end.write(b"event")  # the socket is empty: asyncio sends at once
            with pytest.raises(BlockingIOError):
                client.recv(100)  # not relayed yet: the loop has not run
            relay.pump()
            first = client.recv(100)
            far_end.write(b" and more")
            relay.pump()  # the loop's own read of "event" still comes: it must find nothing to send twice
            await asyncio.sleep(0.1)
            return first, client.recv(100)

    first, rest = asyncio.run(scenario())
    assert (first, rest) == (b"event", b" and more")


def test_pump_leaves_the_end_of_the_stream_to_the_loop(tmp_path):
    """A pump that meets the end of the stream sends nothing; the loop then closes the caller's side."""

    async def scenario():
        async with relay_to_writer(tmp_path) as (relay, client, far_end):
            far_end.write(b"last")
            far_end.close()
            await asyncio.sleep(0)  # the close happens on the loop's next turn
            relay.pump()
            got = b""
            for _ in range(100):
                try:
                    chunk = client.recv(100)
                except BlockingIOError:
                    await asyncio.sleep(0.02)
                    continue
                if not chunk:
                    return got, True
                got += chunk
            return got, False

    assert asyncio.run(scenario()) == (b"last", True)
