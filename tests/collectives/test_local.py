"""What needs no fabric: the FileStore, the operator checks, and a Communicator of one rank."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from libshift.collectives import Communicator, FileStore, ReduceOp
from libshift.collectives.ops import as_array, check_op


def test_file_store_get_waits_for_a_later_set(tmp_path) -> None:
    store = FileStore(tmp_path / "s")
    threading.Timer(0.2, store.set, args=("a/b", b"\x00value")).start()
    started = time.monotonic()
    assert store.get("a/b") == b"\x00value"
    assert time.monotonic() - started >= 0.15
    store.set("a/b", "again")  # str values, as torch's stores take them
    assert store.get("a/b") == b"again"
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["a%2Fb"]  # no temporary files left


def test_file_store_get_times_out_with_one_line(tmp_path) -> None:
    store = FileStore(tmp_path, timeout=0.2)
    with pytest.raises(TimeoutError, match=r"key 'missing' not set within 0.2 s"):
        store.get("missing")


@pytest.mark.parametrize(
    ("op", "dtype", "message"),
    [
        (ReduceOp.BAND, "float32", "BAND needs an integer or bool dtype"),
        (ReduceOp.BXOR, "complex64", "BXOR needs an integer or bool dtype"),
        (ReduceOp.AVG, "int32", "AVG needs a floating-point or complex dtype"),
        (ReduceOp.MAX, "complex128", "MAX is not defined for complex"),
        ("sum", "float32", "op must be a libshift.collectives.ReduceOp"),
    ],
)
def test_operators_refuse_what_they_cannot_reduce(op, dtype: str, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        check_op(op, np.dtype(dtype))


def test_arrays_are_checked_for_layout_dtype_and_writability() -> None:
    with pytest.raises(ValueError, match="must be C-contiguous"):
        as_array(np.zeros((4, 4))[:, 1], "array", writable=True)
    with pytest.raises(TypeError, match="dtype object is not supported"):
        as_array(np.array([None]), "array", writable=True)
    frozen = np.zeros(3)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        as_array(frozen, "array", writable=True)
    assert as_array(frozen, "array", writable=False) is frozen
    with pytest.raises(TypeError, match="expected a numpy array or a CPU tensor, got list"):
        as_array([1, 2], "array", writable=True)
    with pytest.raises(TypeError, match="cannot be viewed as a numpy array"):
        as_array(torch.ones(3, requires_grad=True), "array", writable=True)


def test_a_tensor_is_reduced_in_its_own_memory() -> None:
    tensor = torch.arange(6, dtype=torch.float32)
    assert as_array(tensor, "array", writable=True).ctypes.data == tensor.data_ptr()


@pytest.fixture
def solo(tmp_path):
    with Communicator(FileStore(tmp_path), rank=0, world_size=1) as comm:
        yield comm


def test_one_rank_needs_no_fabric_and_keeps_its_values(solo: Communicator) -> None:
    x = np.arange(5, dtype=np.float32)
    solo.all_reduce(x, ReduceOp.AVG)
    solo.broadcast(x, root=0)
    solo.barrier()
    assert x.tolist() == [0, 1, 2, 3, 4]
    out = [np.zeros(5, np.float32)]
    solo.all_gather(out, x)
    assert out[0].tolist() == x.tolist()
    scattered = np.zeros(5, np.float32)
    solo.reduce_scatter(scattered, [x * 2], ReduceOp.SUM)
    assert scattered.tolist() == [0, 2, 4, 6, 8]
    solo.reduce(x, root=0, op=ReduceOp.MAX)
    gathered = [np.zeros(5, np.float32)]
    solo.gather(gathered, x, root=0)
    solo.scatter(scattered, [x + 1], root=0)
    mine = [np.zeros(2, np.int16)]
    solo.all_to_all(mine, [np.array([7, 9], np.int16)])
    assert x.tolist() == gathered[0].tolist() == [0, 1, 2, 3, 4]
    assert scattered.tolist() == [1, 2, 3, 4, 5] and mine[0].tolist() == [7, 9]
    assert not solo.resilient


def test_user_mistakes_are_one_line_errors(solo: Communicator, tmp_path) -> None:
    x = np.zeros(4, np.int32)
    with pytest.raises(ValueError, match=r"root must be a rank in \[0, 1\), got 1"):
        solo.broadcast(x, root=1)
    with pytest.raises(ValueError, match=r"outputs: expected 1 arrays \(one per rank\), got 2"):
        solo.all_gather([x, x], x)
    with pytest.raises(TypeError, match=r"outputs\[0\]: dtype float32 does not match int32"):
        solo.all_gather([np.zeros(4, np.float32)], x)
    with pytest.raises(ValueError, match=r"inputs\[0\]: shape \(5,\) does not match \(4,\)"):
        solo.reduce_scatter(x, [np.zeros(5, np.int32)])
    with pytest.raises(ValueError, match=r"all_to_all: rank 0 sends 8 bytes to rank 0, which takes 4"):
        solo.all_to_all([np.zeros(1, np.int32)], [np.zeros(2, np.int32)])
    with pytest.raises(ValueError, match=r"inputs: expected 1 arrays \(one per rank\), got 0"):
        solo.scatter(x, [], root=0)
    with pytest.raises(TypeError, match="BAND needs an integer or bool dtype"):
        solo.all_reduce(np.zeros(3), ReduceOp.BAND)
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\), got 2"):
        Communicator(FileStore(tmp_path), rank=2, world_size=2)
    solo.close()
    with pytest.raises(ValueError, match="the communicator is closed"):
        solo.all_reduce(x)
