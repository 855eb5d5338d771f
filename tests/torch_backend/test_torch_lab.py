"""The "shift" backend on the lab fabric: torchrun on two lab hosts, two ranks each, as a training job runs.

Each rank of a host is on its own NIC (local rank i on mlx5_i), the other's NIC its backup, as on a
rail-optimized GPU host; ranks of one host talk across the rails, through the lab's spine. One job for the
module (torch and torchrun cost far more than the collectives): it checks every collective between the
ranks, trains a few DDP steps, then trains the same steps again while `shiftctl fail-nic` takes away host
0's mlx5_0 (local rank 0's NIC, local rank 1's backup) under the ring, and once more over gloo. The three
trainings must end with the same parameters, bit for bit.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence

import pytest
from labs import running_lab
from torchrun_harness import SCRIPT, TORCHRUN, TorchRun, by_rank, finish_all

from shiftlab.lab import Lab

pytestmark = [pytest.mark.lab, pytest.mark.timeout(400)]

STEPS = 6
PAUSE_AT = 2
RANKS_PER_HOST = 2
MASTER = "198.19.0.10"  # host 0 on the management network: torchrun's rendezvous store
PORT = 29411
JOB_TIMEOUT = 300.0


def start_job(lab: Lab, args: Sequence[str]) -> list[TorchRun]:
    """torchrun on each host (node rank = host index) running script.py with `args`."""
    runs = []
    for node, host in enumerate(lab.host_names):
        torchrun = [
            TORCHRUN,
            "--nnodes",
            "2",
            "--nproc-per-node",
            str(RANKS_PER_HOST),
            "--node-rank",
            str(node),
        ]
        rendezvous = ["--master-addr", MASTER, "--master-port", str(PORT)]
        argv, env = lab.exec_command(host, [*torchrun, *rendezvous, SCRIPT, *args])
        env.pop("SHIFT_DEVICE", None)  # the local rank picks the NIC
        runs.append(TorchRun(argv, {**env, "GLOO_SOCKET_IFNAME": "mgmt0"}, f"torchrun on {host}"))
    return runs


def shiftctl(lab: Lab, host: str, *args: str) -> str:
    argv, env = lab.exec_command(host, ["shiftctl", *args])
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def failovers(lab: Lab, host: str) -> int:
    return int(json.loads(shiftctl(lab, host, "status", "--json")).get("failovers", 0))


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


class Job:
    """The job's JSON lines, and whether host 0's shiftd heard of a failover while it ran."""

    def __init__(self, lines: list[dict], failed_over: bool) -> None:
        self.lines = lines
        self.failed_over = failed_over

    def of(self, key: str) -> dict[int, object]:
        return by_rank(self.lines, key)


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Iterator[Job]:
    with running_lab("tb", hosts=2, nics=2) as lab:
        host = lab.host_names[0]
        before = failovers(lab, host)
        resume = tmp_path_factory.mktemp("torch-lab") / "resume"
        args = ["--steps", str(STEPS), "--pause-at", str(PAUSE_AT), "--resume-file", str(resume)]
        runs = start_job(lab, [*args, "--gloo-reference"])
        try:
            runs[0].wait_for("paused", JOB_TIMEOUT)  # rank 0 stopped; the others wait in the next all-reduce
            shiftctl(lab, host, "fail-nic", "mlx5_0")
            resume.touch()
            lines = finish_all(runs, JOB_TIMEOUT)
            yield Job(lines, wait_for(lambda: failovers(lab, host) > before))
        finally:
            for run in runs:
                run.stop()
            shiftctl(lab, host, "recover-nic", "mlx5_0")


def test_each_rank_uses_its_rail_with_failover(job):
    assert job.of("device") == {0: "mlx5_0", 1: "mlx5_1", 2: "mlx5_0", 3: "mlx5_1"}  # by local rank
    assert job.of("backend") == dict.fromkeys(range(4), "shift")
    assert job.of("resilient") == dict.fromkeys(range(4), True)


def test_collectives_between_hosts(job):
    for rank, checks in job.of("checks").items():
        assert len(checks) >= 30, checks
        assert set(checks.values()) == {"ok"}, (rank, {k: v for k, v in checks.items() if v != "ok"})
    for errors in job.of("errors").values():
        refused = "NotImplementedError: the shift backend does not support recv without a source rank ("
        assert errors["recv without a source"].startswith(refused), errors


def test_ddp_between_hosts_trains_as_gloo_does(job):
    params = job.of("params")
    assert len(params) == 4 and len(set(params.values())) == 1
    assert job.of("as_gloo") == dict.fromkeys(range(4), "ok")  # four ranks: gloo adds in another order


def test_fail_nic_during_ddp_changes_no_bit(job):
    assert job.failed_over, "host 0's shiftd counted no failover while the job ran"
    assert job.of("paused_params") == job.of("params")
    steps = [line["step"] for line in job.lines if "step" in line]
    assert sorted(steps) == sorted(list(range(STEPS)) * 3 * 4)  # three trainings on each of four ranks
