"""The training job on a lab: one torchrun per host, one rank per host, rendezvous over mgmt0.

Rank i runs on host hi (torchrun's static rendezvous, --node-rank i), with h0's management address as
the master: the management network stays up whatever happens to the RDMA NICs, as it would in a
cluster. Everything a run leaves behind is in its output directory: rank<R>.jsonl (train.py), the
output of each host's processes (h<i>.log) and rank 0's checkpoint.pt.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shiftlab import fabric
from shiftlab.lab import Lab

TRAIN = Path(__file__).with_name("train.py")
MASTER_PORT = 29500


@dataclass(frozen=True)
class JobSpec:
    """What train.py is asked to do (see its --help)."""

    backend: str = "shift"
    model: str = "small"
    steps: int = 300
    batch: int = 8
    seed: int = 1234
    port: int = MASTER_PORT
    gates: tuple[int, ...] = ()
    checkpoint_every: int = 0  # train.py's --checkpoint-every: 0, only at the end
    max_restarts: int = 0  # torchrun's: how often it restarts the ranks after one failed
    # "torchrun", or "direct": train.py itself with torchrun's environment, which spares the tests the
    # second torch import per host that torchrun costs (seconds of CPU on a loaded machine)
    launcher: str = "torchrun"

    def train_args(self, out: Path) -> list[str]:
        args = [f"--backend={self.backend}", f"--model={self.model}", f"--steps={self.steps}"]
        args += [f"--batch={self.batch}", f"--seed={self.seed}", f"--out={out}"]
        if self.checkpoint_every:
            args.append(f"--checkpoint-every={self.checkpoint_every}")
        return args + [f"--gate-at={g}" for g in self.gates]


class RankLog:
    """A rank's jsonl log, read incrementally while the job writes it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: list[dict[str, Any]] = []
        self._offset = 0
        self._partial = b""

    def refresh(self) -> list[dict[str, Any]]:
        """The records written since the last call (complete lines only)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        new = [json.loads(line) for line in lines if line.strip()]
        self.records += new
        return new

    @property
    def steps(self) -> list[dict[str, Any]]:
        return [r for r in self.records if "step" in r]

    @property
    def last_step(self) -> int:
        """The last step this rank finished, -1 before the first."""
        steps = self.steps
        return steps[-1]["step"] if steps else -1

    def event(self, name: str) -> dict[str, Any] | None:
        return next((r for r in self.records if r.get("event") == name), None)


class Job:
    """One rank on every host of `lab` (under torchrun, or direct); started by start(), ended by wait() or
    stop()."""

    def __init__(self, lab: Lab, spec: JobSpec, out: Path) -> None:
        self.lab, self.spec, self.out = lab, spec, out
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs = [RankLog(out / f"rank{i}.jsonl") for i in range(len(lab.host_names))]

    @property
    def master(self) -> str:
        return self.lab.shape.mgmt_address(0)

    def command(self, rank: int) -> tuple[list[str], dict[str, str]]:
        """argv and the extra environment of rank `rank`."""
        world, train = len(self.lab.host_names), [str(TRAIN), *self.spec.train_args(self.out)]
        if self.spec.launcher == "direct":
            env = {"RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": str(world)}
            env |= {"MASTER_ADDR": self.master, "MASTER_PORT": str(self.spec.port)}
            return [sys.executable, *train], env
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=1"]
        torchrun.append(f"--max-restarts={self.spec.max_restarts}")
        rendezvous = [f"--nnodes={world}", f"--node-rank={rank}"]
        master = [f"--master-addr={self.master}", f"--master-port={self.spec.port}"]
        return [*torchrun, *rendezvous, *master, *train], {}

    def start(self) -> None:
        self._clear()
        for rank, host in enumerate(self.lab.host_names):
            command, extra = self.command(rank)
            argv, env = self.lab.exec_command(host, command)
            env = {**env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra}
            if self.spec.backend == "gloo":  # the baseline without SHIFT: kept off the RDMA NICs
                env.setdefault("GLOO_SOCKET_IFNAME", fabric.MGMT_NETDEV)
            with open(self.out / f"{host}.log", "wb") as log:
                self.procs[host] = subprocess.Popen(
                    argv,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group: stop() reaches the rank too
                )

    def _clear(self) -> None:
        """Remove what an earlier run left in `out`: its open gates and logs would mislead this one."""
        (self.out / "gates").mkdir(parents=True, exist_ok=True)
        patterns = ("gates/go-*", "rank*.jsonl", "h*.log", "checkpoint.pt", "run.json")
        for path in [p for pattern in patterns for p in self.out.glob(pattern)]:
            path.unlink()

    def refresh(self) -> None:
        for log in self.logs:
            log.refresh()

    def open_gate(self, step: int) -> None:
        (self.out / "gates" / f"go-{step}").touch()

    def gate_open(self, step: int) -> bool:
        return (self.out / "gates" / f"go-{step}").exists()

    def finished(self) -> bool:
        return all(p.poll() is not None for p in self.procs.values())

    def failed(self) -> list[str]:
        """Hosts whose torchrun exited with an error (so far)."""
        return [h for h, p in self.procs.items() if p.poll() not in (None, 0)]

    def wait(self, timeout: float) -> dict[str, int]:
        """Exit status per host; a job still running after `timeout` is stopped and reported as -9."""
        deadline = time.monotonic() + timeout
        while not self.finished() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.stop()
        self.refresh()
        return {h: p.returncode for h, p in self.procs.items()}

    def stop(self) -> None:
        """Kill what is still running: torchrun and its rank, by the process group start() made."""
        for p in self.procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
