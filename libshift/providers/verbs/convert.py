"""libshift's completions and QP attributes for the core's verbs backend (libshift.core._verbs).

The enums of libshift.vocabulary carry ibverbs' values, so opcodes, flags and access bits pass as ints, and
immediate data is the host's number on both sides (the backend makes it big-endian for the wire).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from libshift.vocabulary.attrs import Endpoint, QPAttr
from libshift.vocabulary.enums import ibv_wc_opcode, ibv_wc_status, ibv_wr_opcode
from libshift.vocabulary.errors import VerbsError, VerbsRDMAError
from libshift.vocabulary.wr import WC

WC_OPCODE = {
    ibv_wr_opcode.IBV_WR_SEND: ibv_wc_opcode.IBV_WC_SEND,
    ibv_wr_opcode.IBV_WR_SEND_WITH_IMM: ibv_wc_opcode.IBV_WC_SEND,
    ibv_wr_opcode.IBV_WR_RDMA_WRITE: ibv_wc_opcode.IBV_WC_RDMA_WRITE,
    ibv_wr_opcode.IBV_WR_RDMA_WRITE_WITH_IMM: ibv_wc_opcode.IBV_WC_RDMA_WRITE,
    ibv_wr_opcode.IBV_WR_RDMA_READ: ibv_wc_opcode.IBV_WC_RDMA_READ,
    ibv_wr_opcode.IBV_WR_ATOMIC_CMP_AND_SWP: ibv_wc_opcode.IBV_WC_COMP_SWAP,
    ibv_wr_opcode.IBV_WR_ATOMIC_FETCH_AND_ADD: ibv_wc_opcode.IBV_WC_FETCH_ADD,
}
# Widths of the QP attributes in ibv_qp_attr / IB's fields: a larger value would be truncated silently.
ATTR_LIMITS = {"timeout": 31, "retry_cnt": 7, "rnr_retry": 7, "min_rnr_timer": 31, "path_mtu": 5}
LINK_LAYER = {1: "InfiniBand", 2: "Ethernet"}


def work_completion(wc: WC, opcode_if_error: ibv_wc_opcode) -> WC:
    """The backend's WC as libshift reports it, changed in place (a copy costs microseconds a completion).
    ibverbs defines a WC's opcode only on success, so an error WC takes the opcode of the WR it completes
    (the caller remembers it); a status no enum knows is GENERAL_ERR."""
    if not isinstance(wc.status, ibv_wc_status):
        wc.status = ibv_wc_status.IBV_WC_GENERAL_ERR
    if wc.status != ibv_wc_status.IBV_WC_SUCCESS or not isinstance(wc.opcode, ibv_wc_opcode):
        wc.opcode = opcode_if_error
    return wc


def check_attr(attr: QPAttr) -> None:
    """Refuse values that do not fit their field (ibverbs would pass them on truncated)."""
    for name, top in ATTR_LIMITS.items():
        value = getattr(attr, name)
        if not 0 <= value <= top:
            raise VerbsRDMAError(f"QP attribute {name}={value} is outside 0..{top}")


@dataclass(frozen=True)
class Port:
    """What a QP needs of its local port: number, link layer, LID, MTU and the chosen GID index."""

    num: int
    link_layer: str
    lid: int
    active_mtu: int
    gid_index: int


def peer_of(dest: Endpoint | None, qp_num: int) -> Endpoint:
    if dest is None or dest.provider != "verbs":
        raise VerbsError(f"QP {qp_num}: to_rtr needs the peer's verbs Endpoint in attr.dest")
    return dest


def rtr_args(port: Port, attr: QPAttr, peer: Endpoint) -> tuple[bytes, int, int, int, int, int, int, int]:
    """_verbs.QP.to_rtr's arguments: the peer by GID through the chosen index on RoCE (the backend puts it
    in a GRH there) and by LID on InfiniBand, the path MTU both ends can carry, the PSN and the limits."""
    mtu = min(attr.path_mtu, port.active_mtu, int(peer.provider_data.get("mtu", attr.path_mtu)))
    rq_psn = (peer.psn if attr.rq_psn is None else attr.rq_psn) & 0xFFFFFF
    lid = int(peer.provider_data.get("lid", 0))
    gid = ipaddress.IPv6Address(peer.gid).packed
    return gid, peer.qpn, lid, port.gid_index, mtu, rq_psn, attr.min_rnr_timer, attr.max_dest_rd_atomic


def rts_args(attr: QPAttr, psn: int) -> tuple[int, int, int, int, int]:
    """_verbs.QP.to_rts's arguments, coming from RTR: the timers and the send PSN."""
    sq_psn = (psn if attr.sq_psn is None else attr.sq_psn) & 0xFFFFFF
    return attr.timeout, attr.retry_cnt, attr.rnr_retry, sq_psn, attr.max_rd_atomic
