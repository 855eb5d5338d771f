"""The verbs backend's Cython face (libshift.core._verbs): loading without rdma-core, the build that does not
link libibverbs, and RC between two devices (SHIFT_TEST_VERBS_DEVICES: rxe0,rxe1 in the Soft-RoCE VM)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from verbs_devices import Device, verbs_pair

from libshift.core import _verbs
from libshift.verbs import SGE, RecvWR, SendWR, VerbsError
from libshift.verbs import enums as e

ACCESS = 1 | 2 | 4 | 8  # local write, remote write, read, atomic
POST_OK, POST_STATE, POST_SGES = 0, 1, 4
SIZE = 65536
WAIT = 30.0  # TCG runs the guest ten times slower than the host


def test_the_backend_is_not_linked_against_libibverbs() -> None:
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf is missing (binutils)")
    dynamic = subprocess.run([readelf, "-d", _verbs.__file__], capture_output=True, text=True, check=True)
    needed = [line for line in dynamic.stdout.splitlines() if "(NEEDED)" in line]
    assert needed and not [line for line in needed if "ibverbs" in line], needed


def test_a_host_without_libibverbs_imports_it_and_gets_a_clear_error(tmp_path: Path) -> None:
    """dlopen of libibverbs made to fail (an LD_PRELOAD shim): what a host without rdma-core sees."""
    shim = build_shim(tmp_path)
    code = (
        "from libshift.core import _verbs\n"
        "print(_verbs.unavailable(), flush=True)\n"
        "try:\n    _verbs.Context('rxe0')\nexcept Exception as exc:\n    print(type(exc).__name__, exc)\n"
    )
    env = {**os.environ, "LD_PRELOAD": str(shim)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    reason, error = result.stdout.splitlines()
    assert reason.startswith("libibverbs.so.1 cannot be loaded (is rdma-core installed?)"), reason
    assert error == f"VerbsRDMAError {reason}"


def build_shim(tmp_path: Path) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is missing (scripts/ensure-system-deps.sh installs it)")
    shim = tmp_path / "no_ibverbs.so"
    source = Path(_verbs.__file__).parent / "tests" / "no_ibverbs.c"
    argv = ["gcc", "-shared", "-fPIC", "-D_GNU_SOURCE", "-o", str(shim), str(source), "-ldl"]
    subprocess.run(argv, check=True, capture_output=True, timeout=120)
    return shim


def test_an_unknown_device_is_a_one_line_error() -> None:
    with pytest.raises(VerbsError, match="no RDMA device called no-such-device"):
        _verbs.Context("no-such-device")


@dataclass
class Side:
    device: Device
    ctx: _verbs.Context
    pd: _verbs.PD
    chan: _verbs.Channel
    cq: _verbs.CQ
    buf: bytearray
    mr: _verbs.MR
    qp: _verbs.QP
    psn: int

    def sge(self, offset: int, length: int) -> SGE:
        return SGE(self.mr.addr + offset, length, self.mr.lkey)

    def close(self) -> None:
        for obj in (self.qp, self.cq, self.chan, self.mr, self.pd, self.ctx):
            obj.close()


def open_side(device: Device, cookie: int) -> Side:
    ctx = _verbs.Context(device.name)
    pd = _verbs.PD(ctx)
    chan = _verbs.Channel(ctx)
    cq = _verbs.CQ(ctx, 64, chan, cookie)
    buf = bytearray(SIZE)
    mr = _verbs.MR(pd, buf, SIZE, ACCESS)
    qp = _verbs.QP(pd, cq, cq, (16, 16, 2, 2, 64), False)
    return Side(device, ctx, pd, chan, cq, buf, mr, qp, 0x200 + cookie)


def connect(side: Side, peer: Side) -> None:
    mine, theirs = side.ctx.port(), peer.ctx.port()
    side.qp.to_init(ACCESS)
    gid = peer.ctx.gid(peer.device.gid_index)
    mtu = min(mine[1], theirs[1])
    side.qp.to_rtr(gid, peer.qp.qp_num, theirs[2], side.device.gid_index, mtu, peer.psn, 1, 4)
    side.qp.to_rts(14, 7, 7, side.psn, 4)


@pytest.fixture
def pair() -> Iterator[tuple[Side, Side]]:
    a, b = (open_side(device, cookie) for cookie, device in enumerate(verbs_pair(), start=1))
    connect(a, b)
    connect(b, a)
    yield a, b
    a.close()
    b.close()


def one_wc(cq: _verbs.CQ) -> e.ibv_wc_status:
    end = time.monotonic() + WAIT
    while time.monotonic() < end:
        if got := cq.poll(1):
            return got[0]
        time.sleep(0.001)
    pytest.fail("no completion")


@pytest.mark.soft_roce  # in make test-rxe's VM, on rxe0 and rxe1
def test_rc_over_the_face(pair: tuple[Side, Side]) -> None:
    a, b = pair
    assert a.qp.state == b.qp.state == int(e.ibv_qp_state.IBV_QPS_RTS)
    assert b.qp.post_recv([RecvWR(7, sg=[b.sge(1024, 256)])]) == (POST_OK, 1)
    b.cq.req_notify(False)
    a.buf[:5] = b"hello"
    send = SendWR(1, e.ibv_wr_opcode.IBV_WR_SEND_WITH_IMM, sg=[a.sge(0, 5)], imm_data=0xDEADBEEF)

    def post_later() -> None:
        time.sleep(0.3)  # runs only if the wait below let the interpreter lock go
        assert a.qp.post_send([send]) == (POST_OK, 1)

    poster = threading.Thread(target=post_later)
    poster.start()
    assert b.chan.wait(WAIT) == 2  # b's CQ's cookie
    poster.join()
    wc = one_wc(b.cq)
    assert (wc.wr_id, wc.status, wc.opcode, wc.byte_len, wc.imm_data) == (
        7, e.ibv_wc_status.IBV_WC_SUCCESS, e.ibv_wc_opcode.IBV_WC_RECV, 5, 0xDEADBEEF,
    )  # fmt: skip
    assert bytes(b.buf[1024:1029]) == b"hello"
    assert one_wc(a.cq).status == e.ibv_wc_status.IBV_WC_SUCCESS

    write = SendWR(2, e.ibv_wr_opcode.IBV_WR_RDMA_WRITE, sg=[a.sge(0, 5)], remote_addr=b.mr.addr + 4096,
                   rkey=b.mr.rkey)  # fmt: skip
    assert a.qp.post_send([write]) == (POST_OK, 1)
    assert one_wc(a.cq).opcode == e.ibv_wc_opcode.IBV_WC_RDMA_WRITE
    assert bytes(b.buf[4096:4101]) == b"hello"

    b.buf[8192:8200] = (40).to_bytes(8, "little")
    add = SendWR(3, e.ibv_wr_opcode.IBV_WR_ATOMIC_FETCH_AND_ADD, sg=[a.sge(64, 8)],
                 remote_addr=b.mr.addr + 8192, rkey=b.mr.rkey, compare_add=2)  # fmt: skip
    assert a.qp.post_send([add]) == (POST_OK, 1)
    assert one_wc(a.cq).opcode == e.ibv_wc_opcode.IBV_WC_FETCH_ADD
    assert int.from_bytes(a.buf[64:72], "little") == 40
    assert int.from_bytes(b.buf[8192:8200], "little") == 42

    read = SendWR(4, e.ibv_wr_opcode.IBV_WR_RDMA_READ, sg=[a.sge(128, 5)], remote_addr=b.mr.addr + 4096,
                  rkey=b.mr.rkey)  # fmt: skip
    too_many = SendWR(5, e.ibv_wr_opcode.IBV_WR_RDMA_WRITE, sg=[a.sge(0, 1)] * 3,
                      remote_addr=b.mr.addr + 4096, rkey=b.mr.rkey)  # fmt: skip
    granted_sges = a.qp.cap[2]
    err, posted = a.qp.post_send([read, too_many])
    assert (err, posted) == ((POST_SGES, 1) if granted_sges < 3 else (POST_OK, 2))
    wc = one_wc(a.cq)
    assert (wc.wr_id, wc.opcode) == (4, e.ibv_wc_opcode.IBV_WC_RDMA_READ)
    assert bytes(a.buf[128:133]) == b"hello"
    if posted == 2:
        one_wc(a.cq)

    bad = SendWR(6, e.ibv_wr_opcode.IBV_WR_RDMA_WRITE, sg=[a.sge(0, 5)], remote_addr=b.mr.addr,
                 rkey=b.mr.rkey ^ 0x80)  # fmt: skip
    assert a.qp.post_send([bad]) == (POST_OK, 1)
    wc = one_wc(a.cq)
    assert (wc.wr_id, wc.status) == (6, e.ibv_wc_status.IBV_WC_REM_ACCESS_ERR)
    assert a.qp.state == int(e.ibv_qp_state.IBV_QPS_ERR)


@pytest.mark.soft_roce  # in make test-rxe's VM, on rxe0 and rxe1
def test_closing_what_is_in_use_is_refused_and_a_close_ends_a_wait(pair: tuple[Side, Side]) -> None:
    a, _ = pair
    with pytest.raises(VerbsError, match="objects made on it are still open"):
        a.pd.close()
    with pytest.raises(VerbsError, match="objects made on it are still open"):
        a.ctx.close()
    other = _verbs.Channel(a.ctx)
    got: list[int | None] = []
    waiter = threading.Thread(target=lambda: got.append(other.wait(None)))
    waiter.start()
    time.sleep(0.2)
    other.close()
    waiter.join(WAIT)
    assert not waiter.is_alive() and got == [None]
    assert other.fileno() == -1
