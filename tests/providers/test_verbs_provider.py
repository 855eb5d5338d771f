"""The verbs provider without an RNIC: loading, discovery, GID choice, events, and the pyverbs objects it
builds (pyverbs' WRs, WCs and QP attributes are plain structures: they need no device).

With Debian's python3-pyverbs linked into the venv (make setup), the real pyverbs is imported and meets
rdma-core's "no device" answer for real; the tests that need pyverbs say so when it is missing.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from libshift.core import _verbs
from libshift.gid import canonical_gid
from libshift.providers.refusal import refusal
from libshift.providers.verbs import VerbsProvider, binding, convert, fds, gid
from libshift.providers.verbs.events import (
    MEANINGS,
    UNKNOWN,
    AsyncEvent,
    EventType,
    Listeners,
    Scope,
    describe,
    meaning_of,
)
from libshift.providers.verbs.gid import GidEntry, choose_gid, port_dir, read_gid_table
from libshift.verbs import SGE, Endpoint, QPAttr, QPCap, SendWR, VerbsError, VerbsRDMAError
from libshift.verbs import enums as e
from libshift.vocabulary.wr import WC

FIXTURES = Path(__file__).parents[1] / "fixtures"
ROCE, IB, BOND = (FIXTURES / f"sysfs-{kind}" for kind in ("roce", "ib", "bond"))


def pyverbs_or_skip() -> binding.Pyverbs:
    try:
        return binding.load()
    except binding.PyverbsMissing as exc:
        pytest.skip(str(exc))


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env={**os.environ, **env}
    )


# -- loading and discovery ----------------------------------------------------------------------------------


def test_libshift_imports_nothing_of_pyverbs_until_devices_are_listed():
    result = run_python(
        "import sys, libshift.verbs, libshift.device, libshift.shift, libshift.providers.verbs.context\n"
        "print('pyverbs' in sys.modules)"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


NO_DEVICE_PROBE = (
    "from libshift.providers.verbs import VerbsProvider\n"
    "from libshift.device import get_device_list\n"
    "from libshift.verbs import Context, VerbsError\n"
    "p = VerbsProvider(); print(p.devices()); print(p.unavailable)\n"
    "print([d.name for d in get_device_list()])\n"
    "try:\n    Context(name='mlx5_0', provider='verbs')\n"
    "except VerbsError as exc:\n    print(exc)\n"
)


def no_device_answers(prelude: str = "") -> list[str]:
    """What a fresh process's verbs provider lists, why, the devices listed, and the error of opening
    mlx5_0 (a tcp device pv_t0 is configured: the others must still be listed). Where this host has RDMA
    devices (make test-rxe's VM), the process runs as in a container without /dev/infiniband: rdma-core
    lists no device whose node it cannot open, so the answer is a host's without RDMA."""
    argv = [sys.executable, "-c", prelude + NO_DEVICE_PROBE]
    if Path("/dev/infiniband").is_dir():
        hide = 'mount -t tmpfs none /dev/infiniband && exec "$@"'
        argv = ["unshare", "--mount", "sh", "-c", hide, "sh", *argv]
    env = {**os.environ, "SHIFT_TCP_DEVICES": "pv_t0=lo"}
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_without_pyverbs_the_provider_has_no_devices_and_says_why():
    # an import of pyverbs now fails, as when absent
    listed, reason, names, error = no_device_answers("import sys; sys.modules['pyverbs'] = None\n")
    assert listed == "[]"
    assert reason.startswith("pyverbs cannot be loaded") and "python3-pyverbs" in reason
    assert names == "['pv_t0']"  # the tcp devices are still there
    assert error.startswith("no RDMA device 'mlx5_0' (known devices: none); verbs: pyverbs cannot be loaded")


def test_with_pyverbs_and_no_rdma_device_the_list_is_empty_not_an_error():
    pyverbs_or_skip()
    listed, reason, names, error = no_device_answers()
    assert listed == "[]"
    assert reason.startswith("rdma-core found no RDMA device")
    assert names == "['pv_t0']"
    assert error.startswith("no RDMA device 'mlx5_0' (known devices: none); verbs: rdma-core found no RDMA")


def test_pyverbs_errors_become_one_line_verbs_errors_with_their_errno():
    pv = pyverbs_or_skip()
    from pyverbs.pyverbs_error import PyverbsRDMAError

    error = binding.rdma_error("QP 7: post_send", PyverbsRDMAError("Failed to post send", errno.EINVAL))
    assert isinstance(error, VerbsRDMAError) and error.error_code == errno.EINVAL
    assert str(error) == "QP 7: post_send failed: Invalid argument"
    with pytest.raises(VerbsRDMAError) as info, binding.mapped("mlx5_0: open_device", errno.ENODEV):
        raise pv.error("Failed to open\ndevice")  # no errno of its own: the default one is used
    assert str(info.value) == "mlx5_0: open_device failed: No such device"
    assert info.value.error_code == errno.ENODEV


# -- GID choice ---------------------------------------------------------------------------------------------


def copy_tree(tmp_path: Path, tree: Path) -> Path:
    root = tmp_path / tree.name
    shutil.copytree(tree, root, symlinks=True)
    return root


def test_gid_table_of_a_connectx_roce_port():
    table = read_gid_table(ROCE, "mlx5_0", 1)
    assert [(g.index, g.gid, g.type, g.netdev) for g in table] == [
        (0, "fe80::842:ffff:fe00:10", "IB/RoCE v1", "ens1f0np0"),
        (1, "fe80::842:ffff:fe00:10", "RoCE v2", "ens1f0np0"),
        (2, "::ffff:198.18.0.10", "IB/RoCE v1", "ens1f0np0"),
        (3, "::ffff:198.18.0.10", "RoCE v2", "ens1f0np0"),
        (4, "::ffff:198.19.100.10", "IB/RoCE v1", "ens1f0np0.100"),
        (5, "::ffff:198.19.100.10", "RoCE v2", "ens1f0np0.100"),
    ]  # the unused (all-zero) entries 6 and 7 are left out


def test_roce_chooses_v2_ipv4_of_the_ports_own_netdev():
    table = read_gid_table(ROCE, "mlx5_0", 1)
    assert choose_gid(table, "Ethernet", "ens1f0np0").index == 3
    assert choose_gid(table, "Ethernet", "ens1f0np0.100").index == 5  # the VLAN's, when that is the netdev
    assert choose_gid(read_gid_table(BOND, "mlx5_bond_0", 1), "Ethernet", "bond0").index == 3


def test_gid_index_is_chosen_again_after_the_table_moves(tmp_path):
    """After a flap the addresses come back at other indices; the choice follows the entry, not the index."""
    root = copy_tree(tmp_path, ROCE)
    port = root / "class/infiniband/mlx5_0/ports/1"
    for index in (2, 3):
        (port / "gids" / str(index)).write_text("0000:0000:0000:0000:0000:0000:0000:0000\n")
        (port / "gid_attrs/types" / str(index)).unlink()
    (port / "gids/7").write_text("0000:0000:0000:0000:0000:ffff:c612:000a\n")
    (port / "gid_attrs/types/7").write_text("RoCE v2\n")
    (port / "gid_attrs/ndevs/7").write_text("ens1f0np0\n")
    chosen = choose_gid(read_gid_table(root, "mlx5_0", 1), "Ethernet", "ens1f0np0")
    assert (chosen.index, chosen.gid) == (7, "::ffff:198.18.0.10")


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        # no IPv4: a global IPv6 address before a link-local one
        ([(0, "fe80::1", "RoCE v2"), (1, "2001:db8::5", "RoCE v2")], 1),
        # RoCE v2 before v1, even when v1 has the better address
        ([(0, "::ffff:198.18.0.1", "IB/RoCE v1"), (1, "fe80::1", "RoCE v2")], 1),
        # only v1 (a RoCE v1 fabric): v1 it is
        ([(0, "fe80::1", "IB/RoCE v1"), (1, "::ffff:198.18.0.1", "IB/RoCE v1")], 1),
    ],
)
def test_roce_ranking(entries, expected):
    table = [GidEntry(i, canonical_gid(gid), kind, "eth0") for i, gid, kind in entries]
    assert choose_gid(table, "Ethernet", "eth0").index == expected


def test_infiniband_uses_the_port_gid():
    (entry,) = read_gid_table(IB, "mlx5_0", 1)
    assert (entry.index, entry.gid, entry.netdev) == (0, "fe80::a088:c203:45:7e10", "")
    assert choose_gid([entry], "InfiniBand") is entry


def test_a_port_without_gids_is_a_clear_error():
    with pytest.raises(VerbsError, match="no valid GID"):
        choose_gid([], "Ethernet")


def test_provider_names_the_netdev_from_the_gid_table():
    assert VerbsProvider(ROCE)._netdev("mlx5_1") == "ens1f1np1"
    assert VerbsProvider(ROCE)._netdev("mlx5_0") == "ens1f0np0"  # not its VLAN's
    assert VerbsProvider(BOND)._netdev("mlx5_bond_0") == "bond0"
    assert VerbsProvider(IB)._netdev("mlx5_0") == ""


def test_naming_the_netdev_reads_the_gid_table_only_up_to_its_first_valid_entry(tmp_path, monkeypatch):
    """rxe's table has 1024 entries: read whole for every device on each listing, it made a ShiftContext
    take 36 s to open under TCG (tests/failover/test_rxe.py)."""
    root = tmp_path / "sysfs"
    shutil.copytree(ROCE, root, symlinks=True)
    ndevs = port_dir(root, "mlx5_1", 1) / "gid_attrs" / "ndevs"
    for index in range(4, 1024):
        (ndevs / str(index)).write_text("")  # unused: the kernel answers EINVAL
    reads = []
    read = gid.read_attr
    monkeypatch.setattr(gid, "read_attr", lambda path: reads.append(path) or read(path))
    assert VerbsProvider(root)._netdev("mlx5_1") == "ens1f1np1"
    assert [path.name for path in reads] == ["0"]


# -- async events -------------------------------------------------------------------------------------------


def test_event_values_are_ibverbs_values():
    pv = pyverbs_or_skip()
    for kind in EventType:
        assert getattr(pv.enums, f"IBV_EVENT_{kind.name}") == kind.value
    assert set(MEANINGS) == set(EventType)


@pytest.mark.parametrize(
    ("kind", "nic_up", "readdress", "qp_error", "scope"),
    [
        (EventType.PORT_ERR, False, False, False, Scope.PORT),
        (EventType.PORT_ACTIVE, True, True, False, Scope.PORT),  # GID indices move after a flap
        (EventType.GID_CHANGE, None, True, False, Scope.PORT),
        (EventType.QP_FATAL, None, False, True, Scope.QP),
        (EventType.DEVICE_FATAL, False, False, False, Scope.DEVICE),
        (EventType.CQ_ERR, None, False, True, Scope.CQ),
        (EventType.COMM_EST, None, False, False, Scope.QP),
    ],
)
def test_what_each_event_means_to_the_resilience_layer(kind, nic_up, readdress, qp_error, scope):
    meaning = meaning_of(int(kind))
    assert (meaning.nic_up, meaning.readdress, meaning.qp_error, meaning.scope) == (
        nic_up,
        readdress,
        qp_error,
        scope,
    )


def test_an_event_newer_than_the_table_is_named_and_means_nothing():
    assert meaning_of(42) is UNKNOWN
    assert AsyncEvent("mlx5_0", 42, UNKNOWN).name == "UNKNOWN_42"
    assert AsyncEvent("mlx5_0", 10, meaning_of(10), port=1).name == "PORT_ERR"


def test_events_as_surfaced_name_the_port_or_the_failed_qps():
    asked = []

    def failed() -> tuple[int, ...]:
        asked.append(True)
        return (17, 19)

    down = describe("mlx5_0", EventType.PORT_ERR, 1, failed)
    assert (down.port, down.qp_nums, down.meaning.nic_up, asked) == (1, (), False, [])
    fatal = describe("mlx5_0", EventType.QP_FATAL, 1, failed)
    assert (fatal.port, fatal.qp_nums, fatal.name) == (None, (17, 19), "QP_FATAL")
    assert describe("mlx5_0", EventType.DEVICE_FATAL, 1, failed).port == 1


def test_a_failing_listener_does_not_stop_the_others(caplog):
    heard: list[str] = []
    listeners = Listeners()

    def broken(event: AsyncEvent) -> None:
        raise RuntimeError("listener bug")

    listeners.add(broken)
    listeners.add(lambda event: heard.append(event.name))
    listeners.emit(describe("mlx5_0", EventType.GID_CHANGE, 1, tuple))
    assert heard == ["GID_CHANGE"]
    assert "a listener of async event GID_CHANGE failed" in caplog.text


# -- event files --------------------------------------------------------------------------------------------


def test_wait_readable_times_out_then_sees_a_wake():
    waker = fds.Waker()
    try:
        assert fds.wait_readable([waker.fd], 0.05) == []
        waker.wake()
        waker.wake()  # twice is once
        assert fds.wait_readable([waker.fd], 5) == [waker.fd]
        waker.clear()
        assert fds.wait_readable([waker.fd], 0) == []
    finally:
        waker.close()


# -- completions, refusals and QP attributes for the core's verbs backend ------------------------------------


@pytest.mark.parametrize("opcode", list(e.ibv_wr_opcode))
def test_every_send_opcode_has_its_completion_opcode(opcode):
    assert convert.WC_OPCODE[opcode] in e.ibv_wc_opcode


def test_completions_keep_a_good_opcode_and_take_the_wrs_on_an_error():
    recv = WC(3, e.IBV_WC_SUCCESS, e.IBV_WC_RECV_RDMA_WITH_IMM, 7, 64, 77, 2, 8)
    assert convert.work_completion(recv, e.IBV_WC_SEND) is recv  # changed in place, not copied
    assert (recv.opcode, recv.status, recv.imm_data, recv.src_qp) == (e.IBV_WC_RECV_RDMA_WITH_IMM, 0, 77, 8)
    # an error WC's opcode is undefined in ibverbs: the WR's opcode, remembered by the QP, stands in
    flushed = convert.work_completion(WC(4, e.IBV_WC_WR_FLUSH_ERR, 0xEE, 7, 0, 0, 0, 0), e.IBV_WC_RDMA_READ)
    assert (flushed.status, flushed.opcode) == (e.IBV_WC_WR_FLUSH_ERR, e.IBV_WC_RDMA_READ)
    strange = convert.work_completion(WC(5, 99, 0, 7, 0, 0, 0, 0), e.IBV_WC_SEND)
    assert (strange.status, strange.opcode) == (e.IBV_WC_GENERAL_ERR, e.IBV_WC_SEND)


def test_refusals_are_one_line_with_ibverbs_errno():
    cap = QPCap(max_send_wr=8, max_recv_wr=4, max_send_sge=2, max_recv_sge=1, max_inline_data=64)
    wr = SendWR(opcode=42, sg=[SGE(0x1000, 8, 1)])
    unknown = refusal(_verbs.POST_OPCODE, 3, cap, "IBV_QPS_RTS", wr, True)
    assert (str(unknown), unknown.error_code) == ("QP 3: unknown send opcode 42", errno.EINVAL)
    full = refusal(_verbs.POST_QUEUE_FULL, 3, cap, "IBV_QPS_RTS", None, False)
    assert (str(full), full.error_code) == ("QP 3: receive queue full (4 WRs)", errno.ENOMEM)
    device = refusal(_verbs.POST_DEVICE, 3, cap, "IBV_QPS_RTS", wr, True, "Invalid argument")
    assert str(device) == "QP 3: the device refused the post: Invalid argument"


ROCE_PORT = convert.Port(num=1, link_layer="Ethernet", lid=0, active_mtu=5, gid_index=3)
IB_PORT = convert.Port(num=1, link_layer="InfiniBand", lid=0x1A, active_mtu=4, gid_index=0)


def peer(**data) -> Endpoint:
    return Endpoint(gid="::ffff:198.18.0.11", qpn=0x123, psn=0xABCDEF, device="mlx5_0", provider="verbs",
                    provider_data={"lid": 0x2B, "mtu": 5, **data})  # fmt: skip


def test_rtr_addresses_the_peer_by_gid_and_lid_through_the_chosen_index():
    attr = QPAttr(qp_state=e.IBV_QPS_RTR, dest=peer(mtu=3), min_rnr_timer=12, max_dest_rd_atomic=16)
    gid, qpn, lid, sgid_index, mtu, rq_psn, rnr, rd_atomic = convert.rtr_args(ROCE_PORT, attr, attr.dest)
    assert gid == bytes.fromhex("00000000000000000000ffffc612000b")
    assert (qpn, lid, sgid_index, mtu, rq_psn, rnr, rd_atomic) == (0x123, 0x2B, 3, 3, 0xABCDEF, 12, 16)
    ib = convert.rtr_args(IB_PORT, QPAttr(qp_state=e.IBV_QPS_RTR, dest=peer(), rq_psn=7), peer())
    assert (ib[4], ib[5]) == (4, 7)  # the smaller MTU; the PSN asked for


def test_rts_sets_timers_and_send_psn():
    attr = QPAttr(qp_state=e.IBV_QPS_RTS, timeout=14, retry_cnt=3, rnr_retry=7, sq_psn=5, max_rd_atomic=2)
    assert convert.rts_args(attr, 99) == (14, 3, 7, 5, 2)
    assert convert.rts_args(QPAttr(qp_state=e.IBV_QPS_RTS), 99)[3] == 99


def test_rtr_needs_a_verbs_endpoint_and_fields_must_fit():
    tcp_peer = Endpoint(gid="::ffff:198.18.0.11", qpn=1, psn=0, device="mlx5_0", provider="tcp")
    with pytest.raises(VerbsError, match="QP 4: to_rtr needs the peer's verbs Endpoint"):
        convert.peer_of(tcp_peer, 4)
    with pytest.raises(VerbsRDMAError, match=r"retry_cnt=9 is outside 0\.\.7"):
        convert.check_attr(QPAttr(retry_cnt=9))
