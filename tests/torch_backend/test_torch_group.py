"""ShiftProcessGroup in this process, a group of one (no ring): what it refuses, and how it says so.

Every refusal happens at the call, before the communicator, so a group of one shows them all; the
collectives between ranks are tested by test_torch_loopback.py and test_torch_lab.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from libshift.torch.process_group import UNSUPPORTED, ShiftProcessGroup


@pytest.fixture
def group(monkeypatch, tmp_path):
    monkeypatch.setenv("SHIFT_TCP_DEVICES", "mlx5_0=lo")
    monkeypatch.setenv("SHIFT_SOCKET", str(tmp_path / "no-shiftd.sock"))
    monkeypatch.delenv("SHIFT_DEVICE", raising=False)
    group = ShiftProcessGroup(dist.HashStore(), 0, 1, timedelta(seconds=10))
    yield group
    group.shutdown()


def test_it_is_the_shift_backend(group):
    assert group.getBackendName() == "shift" and group.name() == "shift"
    assert (group.rank(), group.size(), group.device) == (0, 1, "mlx5_0")


@pytest.mark.parametrize(("method", "call"), sorted(UNSUPPORTED.items()))
def test_unsupported_calls_name_themselves(group, method, call):
    with pytest.raises(
        NotImplementedError, match=rf"^the shift backend does not support {re.escape(call)} \(it supports "
    ):
        getattr(group, method)([torch.ones(2)], 0, 0)


def test_an_unsupported_operator_is_named(group):
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist._make_nccl_premul_sum(2.0)
    with pytest.raises(
        NotImplementedError, match=r"^the shift backend does not support all_reduce with PREMUL_SUM"
    ):
        group.allreduce([torch.ones(2)], opts)


@pytest.mark.parametrize(
    ("tensor", "error", "message"),
    [
        (torch.ones(3, 2).t(), ValueError, r"^all_reduce: the tensor must be contiguous"),
        (
            torch.ones(2, dtype=torch.bfloat16),
            TypeError,
            r"^all_reduce: the shift backend cannot reduce torch.bfloat16",
        ),
        (
            torch.ones(2, device="meta"),
            ValueError,
            r"^all_reduce: the shift backend takes CPU tensors, got one on meta",
        ),
    ],
)
def test_mistakes_raise_at_the_call(group, tensor, error, message):
    with pytest.raises(error, match=message):
        group.allreduce([tensor])


def test_results_land_in_the_callers_tensors(group):
    """A group of one: all-gather copies the input into the output; bfloat16 travels as bytes."""
    source = torch.arange(6, dtype=torch.bfloat16)
    out = torch.zeros(6, dtype=torch.bfloat16)
    work = group.all_gather_single(out, source)
    assert work.wait() and torch.equal(out, source)
    assert work.get_future().wait() == [out]


def test_all_to_all_single_cuts_along_the_first_dimension(group):
    source = torch.arange(12, dtype=torch.int64).reshape(4, 3)
    out = torch.zeros(4, 3, dtype=torch.int64)
    assert group.all_to_all_single(out, source, [4], [4]).wait() and torch.equal(out, source)
    wrong = r"^all_to_all_single: split sizes \[3\] do not cut 4 rows into 1 parts"
    with pytest.raises(ValueError, match=wrong):
        group.all_to_all_single(out, source, [4], [3])


DDP_WITH_A_LOST_PATH = """
from datetime import timedelta
import torch, torch.distributed as dist
from libshift.collectives import Communicator, NoPathLeft
from libshift.torch.process_group import ShiftProcessGroup

def lost(self, *args, **kwargs):
    raise NoPathLeft("rank 0: h0's mlx5_0 is down (operator_down)")

group = ShiftProcessGroup(dist.HashStore(), 0, 1, timedelta(seconds=10))
Communicator.all_reduce = lost
ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4), process_group=group)
try:
    ddp(torch.ones(2, 4)).sum().backward()
except RuntimeError as exc:
    print("raised:", exc)
"""


def test_a_collective_failing_under_ddp_raises_from_backward(tmp_path):
    """DDP's reducer reads a bucket's future in C++: a failed collective must be an error there (a future
    that held the exception as its value crashed the process with SIGSEGV). In a process of its own."""
    env = {**os.environ, "SHIFT_TCP_DEVICES": "mlx5_0=lo", "SHIFT_SOCKET": str(tmp_path / "none.sock")}
    env.pop("SHIFT_DEVICE", None)
    done = subprocess.run(
        [sys.executable, "-c", DDP_WITH_A_LOST_PATH], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "raised:" in done.stdout and "h0's mlx5_0 is down (operator_down)" in done.stdout, done.stdout
