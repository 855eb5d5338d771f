"""The harness's own sanity check, inside the guest: perftest's ib_write_bw and ib_send_lat from rxe0 to
rxe1, each on the GID the verbs provider would choose. A failure raises: the suites do not run on a
fabric that perftest cannot use. Under TCG the figures (about 11 MB/s, 50-100 us) say nothing of speed.
"""

from __future__ import annotations

import ipaddress
import subprocess
import time
from collections.abc import Iterator

from shiftlab.rxe.network import SYSFS_IB, End

TESTS = ("ib_write_bw", "ib_send_lat")
ITERATIONS = "100"
CONNECT_WINDOW = 20.0  # s for the server to listen before the client gives up
RUN_TIMEOUT = 180.0  # s for one test under TCG
FIRST = End(0)  # rxe0, towards its peer rxe1


def gid_index(end: End) -> int:
    """The index of the end's IPv4 address as a RoCE v2 GID: the one the verbs provider chooses."""
    port = SYSFS_IB / end.device / "ports" / "1"
    mapped = ipaddress.IPv6Address(f"::ffff:{end.address}")
    for path in sorted((port / "gids").iterdir(), key=lambda p: int(p.name)):
        try:
            found = ipaddress.IPv6Address(path.read_text().strip()) == mapped
            if found and (port / "gid_attrs" / "types" / path.name).read_text().strip() == "RoCE v2":
                return int(path.name)
        except (OSError, ValueError):  # unused entries answer EINVAL
            continue
    raise RuntimeError(f"{end.device} has no RoCE v2 GID for {end.address}")


def sanity_check(client: End = FIRST) -> Iterator[str]:
    """One summary line per test as it passes, e.g. 'ib_write_bw rxe0 -> rxe1: 65536 100 8.88 5.04 ...'."""
    for n, test in enumerate(TESTS):
        yield _one(test, client, client.peer, 18515 + n)


def _one(test: str, client: End, server: End, port: int) -> str:
    def argv(end: End) -> list[str]:
        return [
            test,
            "-d",
            end.device,
            "-x",
            str(gid_index(end)),
            "-F",
            "-n",
            ITERATIONS,
            "-p",
            str(port),
        ]

    server_proc = subprocess.Popen(argv(server), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + CONNECT_WINDOW
        while True:
            result = subprocess.run(
                [*argv(client), server.address], capture_output=True, text=True, timeout=RUN_TIMEOUT
            )
            output = result.stdout + result.stderr
            if result.returncode == 0 or "Couldn't connect" not in output or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        server_out, _ = server_proc.communicate(timeout=RUN_TIMEOUT)
    finally:
        if server_proc.poll() is None:
            server_proc.kill()
            server_proc.wait()
    name = f"{test} {client.device} -> {server.device}"
    if result.returncode != 0 or server_proc.returncode != 0:
        last = [line for line in (output + server_out).splitlines() if line.strip()][-1:]
        raise RuntimeError(f"sanity check failed: {name}: {last[0] if last else 'no output'}")
    figures = [line.split() for line in output.splitlines() if line.split()[:1] and line.split()[0].isdigit()]
    return f"{name}: {' '.join(figures[-1]) if figures else 'passed'}"
