"""Collectives between lab hosts: ranks as processes inside the hosts, a FileStore in a temporary directory.

Each rank runs rank.py; the test computes every expected result with numpy (cases.py) and compares bit
for bit. One 2x2 lab serves the two-rank tests (prefix `co`), a 3x2 lab the three-rank test (`cot`).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from cases import Case, expected, make_input
from cases import all_reduce as reference_all_reduce
from labs import running_lab
from waiting import wait_until

from libshift.collectives import ReduceOp
from shiftlab.lab import Lab

sys.path.insert(0, str(Path(__file__).parents[1] / "failover"))
from stream_harness import fail_nic, wait_all_up  # the failover tests' faults and waits

pytestmark = [pytest.mark.lab, pytest.mark.timeout(240)]

RANK = str(Path(__file__).with_name("rank.py"))
MiB = 1 << 20

CASES = [
    Case("all_reduce", "float32", 0),
    Case("all_reduce", "float32", 1),
    Case("all_reduce", "float32", 4097),
    Case("all_reduce", "float32", 1_500_001),  # 6 MB: registered in place, not a multiple of a chunk
    Case("all_reduce", "float64", 300_001),
    Case("all_reduce", "float16", 70_001, "AVG"),
    Case("all_reduce", "float32", 1_048_579, "AVG"),
    Case("all_reduce", "float32", 10_001, "PRODUCT"),
    Case("all_reduce", "int32", 100_003, "MIN"),
    Case("all_reduce", "int64", 50_000, "MAX"),
    Case("all_reduce", "uint8", 65_537, "BAND"),
    Case("all_reduce", "int16", 33_333, "BOR"),
    Case("all_reduce", "bool", 1_001, "BXOR"),
    Case("all_reduce", "complex64", 20_001),
    Case("broadcast", "int32", 1_000_003, root=1),
    # the root stages every chunk and is done before the late rank announces where they go; that
    # announcement is skipped, the next direct call's is used
    Case("broadcast", "int32", 300_000, root=0, late=1),
    Case("broadcast", "float32", 300_000, root=0),
    Case("broadcast", "float64", 5, root=0),
    Case("all_gather", "int8", 300_001),
    Case("all_gather", "float32", 0),
    Case("reduce_scatter", "float32", 200_001),
    Case("reduce_scatter", "int64", 7, "MAX"),
    Case("reduce", "float32", 100_001, root=1),
    Case("reduce", "int64", 7, "MAX"),
    Case("gather", "float64", 30_001, root=1),
    Case("scatter", "int16", 5_001, root=1),
    Case("all_to_all", "float32", 1000),
    Case("all_to_all", "uint8", 0),  # rank 0 sends itself nothing
    Case("barrier"),
]
TORCH_CASES = [
    Case("all_reduce", "float32", 1_500_001, torch=True),
    Case("all_reduce", "float64", 999, "MIN", torch=True),
    Case("broadcast", "float32", 4099, root=1, torch=True),
    Case("all_gather", "int32", 1001, torch=True),
    Case("reduce_scatter", "float32", 20_001, "AVG", torch=True),
    Case("scatter", "float32", 99, root=1, torch=True),
    Case("all_to_all", "int32", 11, torch=True),
]


@pytest.fixture(scope="module")
def lab2():
    with running_lab("co", hosts=2, nics=2) as lab:
        yield lab


class Ranks:
    """rank.py on hosts h0..h{world-1}, sharing a fresh FileStore; stderr kept in files. As a context
    manager it kills on exit whatever rank is still running (a failed test leaves none behind)."""

    def __init__(self, lab: Lab, world: int, tmp: Path, *args: str) -> None:
        self.out = tmp / "out"
        self.out.mkdir(exist_ok=True)
        store = tempfile.mkdtemp(dir=tmp, prefix="store-")
        self.procs, self.errs = [], []
        for rank in range(world):
            argv, env = lab.exec_command(
                f"h{rank}", [sys.executable, RANK, store, str(self.out), str(rank), str(world), *args]
            )
            err = (tmp / f"stderr-{rank}").open("w+")
            self.errs.append(err)
            self.procs.append(
                subprocess.Popen(
                    argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True
                )
            )

    def line(self, rank: int) -> dict:
        text = self.procs[rank].stdout.readline()
        assert text, f"rank {rank} ended early: {self.stderr(rank)}"
        return json.loads(text)

    def stderr(self, rank: int) -> str:
        self.errs[rank].seek(0)
        return self.errs[rank].read()[-4000:]

    def finish(self, timeout: float = 120.0) -> None:
        """Wait for every rank to end; each must succeed."""
        for rank, proc in enumerate(self.procs):
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            assert proc.returncode == 0, f"rank {rank} failed: {self.stderr(rank)}"

    def __enter__(self) -> Ranks:
        return self

    def __exit__(self, *exc: object) -> None:
        for proc, err in zip(self.procs, self.errs, strict=True):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
            proc.stdin.close()
            err.close()


def run_cases(lab: Lab, world: int, tmp: Path, cases: list[Case]) -> Path:
    plan = tmp / "cases.json"
    plan.write_text(json.dumps([c.to_dict() for c in cases]))
    with Ranks(lab, world, tmp, "cases", str(plan)) as ranks:
        for rank in range(world):
            assert ranks.line(rank) == {"ready": True, "resilient": True}
        ranks.finish()
    return ranks.out


def check_cases(out: Path, world: int, cases: list[Case]) -> None:
    """Every rank's every result equals numpy's, bit for bit."""
    for index, case in enumerate(cases):
        for rank in range(world):
            for k, want in enumerate(expected(case, index, rank, world)):
                got = np.load(out / f"{index}-{rank}-{k}.npy")
                assert got.dtype == want.dtype and got.shape == want.shape, f"{case} rank {rank}"
                assert got.tobytes() == want.tobytes(), f"{case}: rank {rank} result {k} differs from numpy"


def test_two_ranks_every_collective_matches_numpy_bitwise_on_arrays_and_tensors(
    lab2: Lab, tmp_path: Path
) -> None:
    out = run_cases(lab2, 2, tmp_path, CASES + TORCH_CASES)
    check_cases(out, 2, CASES + TORCH_CASES)


def test_three_ranks_every_collective_matches_numpy_bitwise(tmp_path: Path) -> None:
    with running_lab("cot", hosts=3, nics=2) as lab:
        out = run_cases(lab, 3, tmp_path, CASES)
    check_cases(out, 3, CASES)


def test_arrays_of_different_sizes_fail_with_one_clear_error(lab2: Lab, tmp_path: Path) -> None:
    with Ranks(lab2, 2, tmp_path, "mismatch") as ranks:
        for rank in range(2):
            assert ranks.line(rank)["ready"]
            first, again = ranks.line(rank)["errors"]
            assert "arrays of the same size?" in first, first
            assert again.startswith("an earlier collective failed")
        ranks.finish()


def shiftctl(lab: Lab, host: str, *args: str) -> str:
    argv, env = lab.exec_command(host, ["shiftctl", *args])
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def failovers(lab: Lab, host: str) -> int:
    return int(json.loads(shiftctl(lab, host, "status", "--json")).get("failovers", 0))


LOOP_COUNT = MiB // 4  # 1 MiB of float32 per all-reduce
AFTER_FAULT = 20  # iterations the loop must run after the NIC failed


def loop_reference(world: int, iterations: int) -> list[np.ndarray]:
    """rank.py's loop in numpy: x <- all_reduce(x) / world + the rank's input, per rank."""
    inputs = [make_input(Case("all_reduce", "float32", LOOP_COUNT), 0, q) for q in range(world)]
    xs = [x.copy() for x in inputs]
    for _ in range(iterations):
        reduced = reference_all_reduce(ReduceOp.SUM, xs)
        xs = [reduced.copy() for _ in range(world)]
        for x, mine in zip(xs, inputs, strict=True):
            np.divide(x, world, out=x)
            x += mine
    return xs


def loop_with_fault(lab: Lab, tmp: Path) -> tuple[int, list[np.ndarray]]:
    """The all-reduce loop on h0 and h1 with `shiftctl fail-nic mlx5_0` on h0 once it runs; stopped
    AFTER_FAULT iterations after the fault. How many iterations it ran, and each rank's result."""
    before = failovers(lab, "h0")
    with Ranks(lab, 2, tmp, "loop", str(LOOP_COUNT)) as ranks:
        assert ranks.line(0)["ready"] and ranks.line(1)["ready"]
        ranks.line(0)  # the first progress report: the loop is under way
        try:
            shiftctl(lab, "h0", "fail-nic", "mlx5_0")
            failed_at = time.time()
            while (line := ranks.line(0)).get("at", 0) < failed_at:
                pass
            while ranks.line(0).get("progress", 0) < line["progress"] + AFTER_FAULT:
                pass
            ranks.procs[0].stdin.write("stop\n")
            ranks.procs[0].stdin.flush()
            while "iterations" not in (end := ranks.line(0)):
                pass
            ranks.finish()
        finally:
            shiftctl(lab, "h0", "recover-nic", "mlx5_0")
    deadline = time.monotonic() + 10
    while failovers(lab, "h0") < before + 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert failovers(lab, "h0") >= before + 2, "shiftd of h0 did not count both QPs' failovers"
    return end["iterations"], [np.load(ranks.out / f"loop-{rank}.npy") for rank in range(2)]


def test_all_reduce_loop_survives_fail_nic_bit_for_bit(lab2: Lab, tmp_path: Path) -> None:
    (tmp_path / "fault").mkdir()
    iterations, failed = loop_with_fault(lab2, tmp_path / "fault")
    (tmp_path / "clean").mkdir()
    fixed = ("loop", str(LOOP_COUNT), "--iterations", str(iterations))
    with Ranks(lab2, 2, tmp_path / "clean", *fixed) as clean:
        clean.finish()
    for rank, want in enumerate(loop_reference(2, iterations)):
        got = np.load(clean.out / f"loop-{rank}.npy")
        assert failed[rank].tobytes() == got.tobytes(), f"rank {rank}: the failover changed bits"
        assert got.tobytes() == want.tobytes(), f"rank {rank} differs from numpy's loop"


HAND_OFF = 1.0  # seconds from the last path's failure to every rank's error (issue 19), with 2 ranks
HAND_OFF_LOADED = 10.0  # a ring of 4 on a machine shared with the test VM: told at all, not how fast


def lose_every_path_of_h0(lab: Lab, world: int, tmp: Path) -> tuple[dict[int, dict], float]:
    """The all-reduce loop on h0..h{world-1}; h0 loses mlx5_0 (the loop goes on over mlx5_1), then mlx5_1.
    Each rank's error line, and when the last path went (time.time())."""
    wait_all_up(lab)  # a NIC still DOWN as the lab starts would count as a path already lost
    with Ranks(lab, world, tmp, "loop", str(LOOP_COUNT)) as ranks:
        for rank in range(world):
            assert ranks.line(rank)["ready"]
        ranks.line(0)
        try:
            shiftctl(lab, "h0", "fail-nic", "mlx5_0")
            moved_at = time.time()
            while (line := ranks.line(0)).get("at", 0) < moved_at:
                pass  # running on mlx5_1
            assert "error" not in line, f"the failover to mlx5_1 failed: {line}"
            lost_at = fail_nic(lab, ["h0"], "mlx5_1")
            errors = {}
            for rank in range(world):
                while "error" not in (line := ranks.line(rank)):
                    pass
                errors[rank] = line
            for proc in ranks.procs:
                assert proc.wait(timeout=30) != 0
        finally:
            shiftctl(lab, "h0", "recover-nic", "mlx5_0")
            shiftctl(lab, "h0", "recover-nic", "mlx5_1")
    return errors, lost_at


def assert_told(error: dict, lost_at: float, rank: int, within: float) -> None:
    """NoPathLeft within `within` s, naming h0's NICs and why (shiftd's word, or the link watch's when it
    saw the link go before shiftd's word came), and what to do."""
    assert error["kind"] == "NoPathLeft", (rank, error)
    assert error["at"] - lost_at < within, (rank, error["at"] - lost_at, error)
    message = error["error"]
    assert re.search(r"h0's mlx5_0 is down \((operator_down|link lost)\)", message), (rank, message)
    assert re.search(r"h0's mlx5_1 is down \((operator_down|link lost)\)", message), (rank, message)
    assert "restart it from its last checkpoint, or shrink the group" in message, (rank, message)


def test_when_a_host_loses_every_path_both_ranks_are_told_within_a_second(lab2: Lab, tmp_path: Path) -> None:
    """No path is left between the two ranks: both raise NoPathLeft and end non-zero, h0 from its own NIC
    events, h1 from h0's NIC records in etcd (its own NICs are fine: its ack deadline would have said so
    only seconds later, as a retry error naming no host), or from the alarm h0's rank raised in the store
    when h1's rank looked there first (it does between waits): either way within the second, and h1's
    shiftd has followed h0's records."""
    errors, lost_at = lose_every_path_of_h0(lab2, 2, tmp_path)
    for rank, error in errors.items():
        assert_told(error, lost_at, rank, HAND_OFF)
    assert "another rank found" not in errors[0]["error"]  # h0's rank saw it itself
    followed = re.compile(r"peer h0: mlx5_1 \(\S+\) NIC_STATE_DOWN")
    assert wait_until(lambda: followed.search(lab2.log_path("h1").read_text()), timeout=10)


def test_a_rank_that_is_not_the_lost_hosts_neighbour_is_told_too(tmp_path: Path) -> None:
    """A ring of four: h2 has no QP to h0, its ring only stalls; the alarm in the store (raised by the first
    rank to find no path left) tells it too, long before the ring's timeout (60 s)."""
    with running_lab("cof", hosts=4, nics=2) as lab:
        errors, lost_at = lose_every_path_of_h0(lab, 4, tmp_path)
    for rank, error in errors.items():
        assert_told(error, lost_at, rank, HAND_OFF_LOADED)
    assert "another rank found" in errors[2]["error"]
