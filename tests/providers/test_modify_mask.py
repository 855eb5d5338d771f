"""QP.modify(attr, attr_mask) as pyverbs calls it: the mask must hold what ibv_modify_qp requires of an RC
transition, and then the transition happens. And QP(pd, init_attr, qp_attr), which goes to INIT."""

from __future__ import annotations

import pytest

from libshift.verbs import CQ, PD, QP, Context, QPAttr, QPInitAttr, VerbsRDMAError
from libshift.verbs import enums as e

INIT = e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_ACCESS_FLAGS


def a_qp(ctx: Context) -> QP:
    cq = CQ(ctx, 4)
    return QP(PD(ctx), QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq))


def test_a_mask_without_the_state_is_refused(lo_context: Context) -> None:
    qp = a_qp(lo_context)
    with pytest.raises(VerbsRDMAError, match="must hold IBV_QP_STATE"):
        qp.modify(QPAttr(qp_state=e.IBV_QPS_INIT), INIT & ~e.IBV_QP_STATE)
    assert qp.qp_state == e.IBV_QPS_RESET


def test_a_mask_short_of_the_transition_names_what_it_lacks(lo_context: Context) -> None:
    qp = a_qp(lo_context)
    with pytest.raises(VerbsRDMAError, match="lacks IBV_QP_PORT") as raised:
        qp.modify(QPAttr(qp_state=e.IBV_QPS_INIT), INIT & ~e.IBV_QP_PORT)
    assert raised.value.error_code == 22  # EINVAL, as ibv_modify_qp
    qp.modify(QPAttr(qp_state=e.IBV_QPS_INIT, qp_access_flags=e.ALL_ACCESS), INIT)
    assert qp.qp_state == e.IBV_QPS_INIT
    with pytest.raises(VerbsRDMAError, match=r"lacks IBV_QP_AV \| IBV_QP_DEST_QPN$"):
        qp.modify(QPAttr(qp_state=e.IBV_QPS_RTR), e.IBV_QP_STATE | e.IBV_QP_PATH_MTU | e.IBV_QP_RQ_PSN
                  | e.IBV_QP_MAX_DEST_RD_ATOMIC | e.IBV_QP_MIN_RNR_TIMER)  # fmt: skip


def test_a_qp_made_with_a_qp_attr_is_in_init(lo_context: Context) -> None:
    cq = CQ(lo_context, 4)
    init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq)
    qp = QP(PD(lo_context), init, QPAttr(qp_access_flags=e.ALL_ACCESS))
    assert qp.qp_state == e.IBV_QPS_INIT
