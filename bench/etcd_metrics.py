"""A lab's etcd as the benchmarks see it: each member's own /metrics, its keys, and a member's loss.

Shared by bench/soak.py (write counters) and bench/fleet_scale.py (writes, watch events, database size,
memory and CPU of every member; a member killed and started again).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import urllib.request

from shiftlab import netns
from shiftlab.lab import Lab
from shiftlab.pids import Pid


def scrape(lab: Lab, endpoint: str) -> dict[str, float]:
    """Every unlabelled sample of one member's /metrics (counters, gauges, histograms' _sum and _count)."""

    def fetch() -> str:
        with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10) as response:
            return response.read().decode()

    samples: dict[str, float] = {}
    for line in netns.run(lab.shape.mgmt_ns, fetch).splitlines():
        name, _, value = line.partition(" ")
        if name and not name.startswith("#") and "{" not in name:
            samples[name] = float(value)
    return samples


def scrape_all(lab: Lab) -> list[dict[str, float]]:
    """Each member's samples, in the lab's member order; a member that does not answer gives {}."""
    out = []
    for endpoint in lab.etcd_endpoints:
        try:
            out.append(scrape(lab, endpoint))
        except OSError:
            out.append({})
    return out


def etcdctl(lab: Lab, *args: str, timeout: float = 120.0) -> str:
    """etcdctl against every member of the lab, from its management namespace."""
    argv = ["etcdctl", "--endpoints", ",".join(lab.etcd_endpoints), "--command-timeout", "60s", *args]
    env = {**os.environ, "ETCDCTL_API": "3"}
    done = subprocess.run(
        netns.command(lab.shape.mgmt_ns, argv), capture_output=True, text=True, env=env, timeout=timeout
    )
    if done.returncode != 0:
        raise RuntimeError(f"etcdctl {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def dump(lab: Lab, prefix: str) -> dict[str, tuple[str, int]]:
    """Every key under `prefix`: key -> (value, lease id), read in one linearizable range."""
    reply = json.loads(etcdctl(lab, "get", "--prefix", prefix, "-w", "json"))
    return {
        base64.b64decode(kv["key"]).decode(): (
            base64.b64decode(kv.get("value", "")).decode(),
            int(kv.get("lease", 0)),
        )
        for kv in reply.get("kvs", [])
    }


def member_pid(lab: Lab, key: str) -> Pid:
    """The running member `key` ("etcd", "etcd1", ...) as the lab recorded it (PID and start time)."""
    record = json.loads(lab.state_path.read_text())["pids"][key]
    return Pid(record["pid"], record["start"])


def kill_member(lab: Lab, key: str) -> None:
    """SIGKILL one member of the lab (the process the lab started, by PID); `lab.up()` starts it again."""
    pid = member_pid(lab, key)
    if pid.alive():
        os.kill(pid.pid, signal.SIGKILL)


def leader(lab: Lab) -> int | None:
    """The index of the member that leads now, by the members' own word."""
    for i, samples in enumerate(scrape_all(lab)):
        if samples.get("etcd_server_is_leader") == 1.0:
            return i
    return None
