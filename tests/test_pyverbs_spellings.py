"""pyverbs' spellings in libshift's vocabulary: the names, orders and defaults a pyverbs program relies on."""

from __future__ import annotations

import pytest

from libshift.verbs import GID, SGE, WC, AHAttr, Endpoint, GlobalRoute, QPAttr, SendWR, VerbsError
from libshift.verbs import enums as e


def test_send_wr_takes_pyverbs_positional_order() -> None:
    sge = SGE(0x1000, 8, 3)
    wr = SendWR(5, e.IBV_WR_SEND_WITH_IMM, 1, 0xBEEF, [sge], e.IBV_SEND_SIGNALED)
    assert (wr.wr_id, wr.opcode, wr.num_sge, wr.imm_data, wr.sg, wr.send_flags) == (
        5, e.IBV_WR_SEND_WITH_IMM, 1, 0xBEEF, [sge], e.IBV_SEND_SIGNALED,
    )  # fmt: skip
    copy = wr.copy_with(6, [], 0, 9)
    assert (copy.wr_id, copy.imm_data, copy.sg, copy.send_flags, copy.rkey) == (6, 0xBEEF, [], 0, 9)


def test_a_wc_has_every_field_of_pyverbs_wc() -> None:
    wc = WC(1, e.IBV_WC_SUCCESS, e.IBV_WC_RECV, 7)
    for name in ("vendor_err", "byte_len", "src_qp", "imm_data", "wc_flags", "pkey_index", "slid", "sl"):
        assert getattr(wc, name) == 0
    assert wc.dlid_path_bits == 0


def test_a_gid_is_its_text_and_has_pyverbs_gid_property() -> None:
    gid = GID("::ffff:198.18.0.1")
    assert gid == "::ffff:198.18.0.1" and gid.gid == "::ffff:198.18.0.1"
    assert GID() == "::"


def test_the_peer_comes_from_pyverbs_fields_or_from_dest() -> None:
    attr = QPAttr(qp_state=e.IBV_QPS_RTR, port_num=1)
    assert attr.peer() is None  # nothing named yet
    attr.dest_qp_num, attr.rq_psn = 0x1234_05, 77
    attr.ah_attr = AHAttr(is_global=1, gr=GlobalRoute(dgid=GID("::ffff:10.0.0.2"), sgid_index=1), port_num=1)
    assert attr.peer() == Endpoint(gid="::ffff:10.0.0.2", qpn=0x1234_05, psn=77)
    attr.dest = Endpoint(gid="::ffff:10.0.0.9", qpn=9, psn=1, device="d", provider="tcp")
    assert attr.peer() is attr.dest  # dest, when given, names the peer (the shift layer swaps it per path)


def test_qp_attr_keeps_pyverbs_first_four_positions() -> None:
    attr = QPAttr(e.IBV_QPS_INIT, e.IBV_QPS_RESET, 1, e.IBV_MTU_1024)
    assert (attr.qp_state, attr.cur_qp_state, attr.port_num, attr.path_mtu) == (
        e.IBV_QPS_INIT, e.IBV_QPS_RESET, 1, e.IBV_MTU_1024,
    )  # fmt: skip


def test_a_global_ah_attr_needs_its_route() -> None:
    with pytest.raises(VerbsError, match="is_global is set but gr"):
        AHAttr(is_global=1)
