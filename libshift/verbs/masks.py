"""ibv_modify_qp's rule for an RC QP: the attributes each transition must be given, named by attr_mask."""

from __future__ import annotations

from libshift.vocabulary.attrs import QPAttr
from libshift.vocabulary.enums import ibv_qp_attr_mask as M
from libshift.vocabulary.enums import ibv_qp_state as S
from libshift.vocabulary.errors import VerbsRDMAError

REQUIRED = {
    (S.IBV_QPS_RESET, S.IBV_QPS_INIT): M.IBV_QP_PKEY_INDEX | M.IBV_QP_PORT | M.IBV_QP_ACCESS_FLAGS,
    (S.IBV_QPS_INIT, S.IBV_QPS_RTR): M.IBV_QP_AV
    | M.IBV_QP_PATH_MTU
    | M.IBV_QP_DEST_QPN
    | M.IBV_QP_RQ_PSN
    | M.IBV_QP_MAX_DEST_RD_ATOMIC
    | M.IBV_QP_MIN_RNR_TIMER,
    (S.IBV_QPS_RTR, S.IBV_QPS_RTS): M.IBV_QP_TIMEOUT
    | M.IBV_QP_RETRY_CNT
    | M.IBV_QP_RNR_RETRY
    | M.IBV_QP_SQ_PSN
    | M.IBV_QP_MAX_QP_RD_ATOMIC,
}


def check_mask(current: S, attr: QPAttr, attr_mask: int) -> None:
    """EINVAL, as ibv_modify_qp answers, when the mask lacks the state or what the transition requires."""
    if not attr_mask & M.IBV_QP_STATE:
        raise VerbsRDMAError(
            "modify: attr_mask must hold IBV_QP_STATE (only state transitions are supported)"
        )
    missing = REQUIRED.get((current, S(attr.qp_state)), M(0)) & ~M(attr_mask)
    if missing:
        names = " | ".join(flag.name or "" for flag in M if flag & missing)
        raise VerbsRDMAError(f"modify to {S(attr.qp_state).name}: attr_mask lacks {names}")
