"""What shiftd did and recorded, asked from outside the job as an operator would.

The final records go through the real `shiftctl` inside each host, and so can fault injection (the
commands the demo shows). Polling the failover counters while the job runs goes to the same admin
service in-process, as can fault injection when it must land within milliseconds: a shiftctl process
costs a second or more of the two shared cores, long enough for a tiny test job to get far past the
step it was meant to hit.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from typing import Any

import grpc

from libshift.api.shift.v1 import admin_pb2
from shiftd.ctl import MODES, Client, state_name
from shiftlab.lab import Lab

CTL_TIMEOUT = 60.0


class ShiftctlError(RuntimeError):
    """shiftctl failed; str() is its own one-line message."""


def shiftctl(lab: Lab, host: str, *args: str) -> str:
    """Run `shiftctl ARGS` inside `host`; its stdout, or ShiftctlError with its stderr."""
    argv, env = lab.exec_command(host, ["shiftctl", *args])
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=CTL_TIMEOUT)
    if done.returncode != 0:
        raise ShiftctlError(f"{host}: shiftctl {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def events(lab: Lab, host: str, since_ns: int = 0) -> list[dict[str, Any]]:
    """`shiftctl events --json` of `host`, from `since_ns` (Unix ns) on."""
    lines = shiftctl(lab, host, "events", "--json", "--backlog", "1000").splitlines()
    found = [json.loads(line) for line in lines if line.strip()]
    return [e for e in found if int(e.get("time_unix_nanos", 0)) >= since_ns]


class Admin:
    """The admin service of every host's shiftd, in-process; counts are relative to when it was made."""

    def __init__(self, lab: Lab, timeout: float = 5.0) -> None:
        self.clients = {h: Client(str(lab.socket(h)), timeout) for h in lab.host_names}
        self.base = {h: self._read(h) for h in lab.host_names}

    def fail_nic(self, host: str, device: str, mode: str) -> str:
        """What `shiftctl fail-nic` does, without its start-up; says what shiftd answered."""
        request = admin_pb2.FailNicRequest(device=device, mode=MODES[mode])
        nic = self._call(host, "FailNic", request).nic
        return f"{nic.device} ({nic.netdev}): {mode} injected; state {state_name(nic.state)} ({nic.reason})"

    def recover_nic(self, host: str, device: str) -> str:
        nic = self._call(host, "RecoverNic", admin_pb2.RecoverNicRequest(device=device)).nic
        return f"{nic.device} ({nic.netdev}): fault cleared; state {state_name(nic.state)} ({nic.reason})"

    def _call(self, host: str, method: str, request: Any) -> Any:
        """An admin call, its failure as one line (shiftctl's wording)."""
        client = self.clients[host]
        try:
            return getattr(client.admin, method)(request, timeout=client.timeout)
        except grpc.RpcError as exc:
            raise ShiftctlError(f"{host}: {client.explain(exc)}") from None

    def _read(self, host: str) -> tuple[int, int]:
        reply = self._call(host, "Status", admin_pb2.StatusRequest())
        return reply.failovers, reply.failbacks

    def delta(self, host: str) -> tuple[int, int]:
        """(failovers, failbacks) on `host` since this object was made."""
        now, base = self._read(host), self.base[host]
        return now[0] - base[0], now[1] - base[1]

    def failed_over(self, host: str) -> bool:
        """`host` has counted a failover."""
        return self.delta(host)[0] >= 1

    def all_back(self, host: str) -> bool:
        """`host` has counted a failover, and every host as many failbacks as failovers."""
        counts = {h: self.delta(h) for h in self.clients}
        return counts[host][0] >= 1 and all(fb >= fo for fo, fb in counts.values())

    def wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """True once `predicate()` is, False when `timeout` passes first."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def close(self) -> None:
        for client in self.clients.values():
            client.close()
