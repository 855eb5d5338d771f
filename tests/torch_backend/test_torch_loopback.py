"""The "shift" backend without a lab: registration at `import torch`, and a 2-rank torchrun on loopback.

The two ranks run on one host whose tcp devices mlx5_0 and mlx5_1 are both `lo`, so each rank's device
shows whether the local rank chose it; no shiftd, so the rings run without failover.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from torchrun_harness import SCRIPT, TORCHRUN, TorchRun, by_rank

REGISTERED = "'shift' in dist.Backend.backend_list"
BEFORE_AND_AFTER = (  # registered after importing torch, and after importing libshift.torch
    "import json, torch.distributed as dist; "
    f"before = {REGISTERED}; import libshift.torch; print(json.dumps([before, {REGISTERED}]))"
)


def fresh_python(code: str, cwd: Path, **env: str) -> list:
    """Run in `cwd`, away from the source tree: a stale shift.egg-info there would stand in for the venv's."""
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_importing_torch_registers_the_backend(tmp_path):
    """The entry point in the group torch.backends (pip install -e . puts it in the venv) does it."""
    assert fresh_python(BEFORE_AND_AFTER, tmp_path) == [True, True]


def test_without_autoload_importing_libshift_torch_registers_it(tmp_path):
    assert fresh_python(BEFORE_AND_AFTER, tmp_path, TORCH_DEVICE_BACKEND_AUTOLOAD="0") == [False, True]


def test_importing_libshift_torch_before_torch_and_cpu_shift(tmp_path):
    """torch's autoload then calls back into libshift.torch while that is still being imported; after it,
    a group of one made as "cpu:shift" (the device:backend form) is a shift group."""
    code = (
        "import json, libshift.torch, torch, torch.distributed as dist; "
        f"registered = {REGISTERED}; "
        f"dist.init_process_group('cpu:shift', init_method='file://{tmp_path}/store', rank=0, world_size=1); "
        "t = torch.ones(2); dist.all_reduce(t); "
        "print(json.dumps([registered, dist.get_backend(), repr(dist.group.WORLD), t.tolist()])); "
        "dist.destroy_process_group()"
    )
    env = {
        "SHIFT_TCP_DEVICES": "mlx5_0=lo",
        "SHIFT_SOCKET": str(tmp_path / "no-shiftd.sock"),
        "SHIFT_DEVICE": "",
    }
    registered, backend, group, result = fresh_python(code, tmp_path, **env)
    assert (registered, backend, result) == (True, "cpu:shift", [1.0, 1.0])
    assert group == "ShiftProcessGroup(rank=0, size=1, device='mlx5_0')"


@pytest.fixture(scope="module")
def loopback_run(tmp_path_factory) -> list[dict]:
    env = {
        **os.environ,
        "SHIFT_TCP_DEVICES": "mlx5_0=lo,mlx5_1=lo",
        "SHIFT_SOCKET": str(tmp_path_factory.mktemp("no-shiftd") / "shiftd.sock"),  # none: plain contexts
        "GLOO_SOCKET_IFNAME": "lo",
    }
    env.pop("SHIFT_DEVICE", None)
    argv = [TORCHRUN, "--standalone", "--nproc-per-node", "2", SCRIPT, "--steps", "3", "--gloo-reference"]
    run = TorchRun(argv, env, "torchrun on loopback")
    try:
        return run.finish(timeout=240)
    finally:
        run.stop()


def test_each_local_rank_takes_its_own_device(loopback_run):
    assert by_rank(loopback_run, "local_rank") == {0: 0, 1: 1}
    assert by_rank(loopback_run, "device") == {0: "mlx5_0", 1: "mlx5_1"}
    assert by_rank(loopback_run, "backend") == {0: "shift", 1: "shift"}


def test_collectives_give_the_expected_values(loopback_run):
    for rank, checks in by_rank(loopback_run, "checks").items():
        assert len(checks) >= 30, checks
        assert set(checks.values()) == {"ok"}, (rank, {k: v for k, v in checks.items() if v != "ok"})


def test_unsupported_calls_name_themselves(loopback_run):
    for errors in by_rank(loopback_run, "errors").values():
        assert errors["recv without a source"].startswith(
            "NotImplementedError: the shift backend does not support recv without a source rank ("
        ), errors
        gloo_only = "ValueError: monitored_barrier is only implemented for GLOO backend."
        assert errors["monitored_barrier"] == gloo_only  # torch's own check, naming the call


def test_mistakes_are_one_line_errors_naming_the_call(loopback_run):
    for errors in by_rank(loopback_run, "errors").values():
        assert errors["all_reduce of a non-contiguous tensor"] == (
            "ValueError: all_reduce: the tensor must be contiguous (call .contiguous() first)"
        )
        assert errors["all_reduce of bfloat16"] == (
            "TypeError: all_reduce: the shift backend cannot reduce torch.bfloat16 tensors"
        )
        error = errors["broadcast from a rank out of range"]
        assert error.startswith("ValueError: broadcast: ") and "7" in error and "\n" not in error, error


def test_ddp_trains_as_gloo_does_bit_for_bit(loopback_run):
    """Two ranks: each sum has two terms, so any correct all-reduce gives gloo's bits exactly."""
    params = by_rank(loopback_run, "params")
    assert len(set(params.values())) == 1 and len(params) == 2
    assert by_rank(loopback_run, "as_gloo") == {0: "ok", 1: "ok"}  # two ranks: the same bits
