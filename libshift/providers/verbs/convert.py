"""libshift's work requests, completions and QP attributes to and from pyverbs' objects.

The enums of libshift.vocabulary carry ibverbs' values, so opcodes, flags and access bits pass as ints. Two
things do not pass as they are: immediate data is big-endian on the wire (ibverbs' __be32; libshift's
imm_data is the host's number, as the tcp provider carries it), and pyverbs refuses a WR without SGEs,
which ibverbs allows (a zero-length SEND), so such a WR is built with one SGE and num_sge set to 0.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

from libshift.providers.verbs.binding import Pyverbs
from libshift.providers.verbs.gid import exploded_gid
from libshift.vocabulary.attrs import Endpoint, QPAttr
from libshift.vocabulary.enums import ibv_qp_state, ibv_wc_opcode, ibv_wc_status, ibv_wr_opcode
from libshift.vocabulary.errors import VerbsError, VerbsRDMAError
from libshift.vocabulary.wr import SGE, WC, RecvWR, SendWR

ATOMICS = frozenset({ibv_wr_opcode.IBV_WR_ATOMIC_CMP_AND_SWP, ibv_wr_opcode.IBV_WR_ATOMIC_FETCH_AND_ADD})
RDMA = frozenset(
    {
        ibv_wr_opcode.IBV_WR_RDMA_WRITE,
        ibv_wr_opcode.IBV_WR_RDMA_WRITE_WITH_IMM,
        ibv_wr_opcode.IBV_WR_RDMA_READ,
    }
)
WITH_IMM = frozenset({ibv_wr_opcode.IBV_WR_SEND_WITH_IMM, ibv_wr_opcode.IBV_WR_RDMA_WRITE_WITH_IMM})
WC_OPCODE = {
    ibv_wr_opcode.IBV_WR_SEND: ibv_wc_opcode.IBV_WC_SEND,
    ibv_wr_opcode.IBV_WR_SEND_WITH_IMM: ibv_wc_opcode.IBV_WC_SEND,
    ibv_wr_opcode.IBV_WR_RDMA_WRITE: ibv_wc_opcode.IBV_WC_RDMA_WRITE,
    ibv_wr_opcode.IBV_WR_RDMA_WRITE_WITH_IMM: ibv_wc_opcode.IBV_WC_RDMA_WRITE,
    ibv_wr_opcode.IBV_WR_RDMA_READ: ibv_wc_opcode.IBV_WC_RDMA_READ,
    ibv_wr_opcode.IBV_WR_ATOMIC_CMP_AND_SWP: ibv_wc_opcode.IBV_WC_COMP_SWAP,
    ibv_wr_opcode.IBV_WR_ATOMIC_FETCH_AND_ADD: ibv_wc_opcode.IBV_WC_FETCH_ADD,
}
WC_OPCODES = frozenset(int(op) for op in ibv_wc_opcode)
HOP_LIMIT = 64  # RoCE v2 crosses routers; 1 would keep it on the subnet
# Widths of the QP attributes in ibv_qp_attr / IB's fields: a larger value would be truncated silently.
ATTR_LIMITS = {"timeout": 31, "retry_cnt": 7, "rnr_retry": 7, "min_rnr_timer": 31, "path_mtu": 5}
LINK_LAYER = {1: "InfiniBand", 2: "Ethernet"}


def sge_list(pv: Pyverbs, sges: list[SGE]) -> tuple[list[Any], int]:
    """pyverbs SGEs and their count; a placeholder SGE (count 0) for an empty list."""
    if not sges:
        return [pv.wr.SGE(0, 0, 0)], 0
    return [pv.wr.SGE(s.addr, s.length, s.lkey) for s in sges], len(sges)


def send_wr(pv: Pyverbs, wr: SendWR) -> Any:
    try:
        opcode = ibv_wr_opcode(wr.opcode)
    except ValueError:
        raise VerbsRDMAError(f"unknown send opcode {wr.opcode}") from None
    sg, count = sge_list(pv, wr.sges())
    imm = socket.htonl(wr.imm_data & 0xFFFFFFFF) if opcode in WITH_IMM else 0
    out = pv.wr.SendWR(
        wr_id=wr.wr_id,
        opcode=int(opcode),
        num_sge=len(sg),
        sg=sg,
        send_flags=int(wr.send_flags),
        imm_data=imm,
    )
    out.num_sge = count
    if opcode in RDMA:
        out.set_wr_rdma(wr.rkey, wr.remote_addr)
    elif opcode in ATOMICS:
        out.set_wr_atomic(wr.rkey, wr.remote_addr, wr.compare_add, wr.swap)
    return out


def recv_wr(pv: Pyverbs, wr: RecvWR) -> Any:
    sg, count = sge_list(pv, wr.sges())
    out = pv.wr.RecvWR(wr_id=wr.wr_id, num_sge=len(sg), sg=sg)
    out.num_sge = count
    return out


def work_completion(raw: Any, opcode_if_error: ibv_wc_opcode) -> WC:
    """A libshift WC from a pyverbs WC. ibverbs defines a WC's opcode only on success, so an error WC
    takes the opcode of the WR it completes (the caller remembers it)."""
    try:
        status = ibv_wc_status(raw.status)
    except ValueError:
        status = ibv_wc_status.IBV_WC_GENERAL_ERR
    opcode = opcode_if_error
    if status == ibv_wc_status.IBV_WC_SUCCESS and raw.opcode in WC_OPCODES:
        opcode = ibv_wc_opcode(raw.opcode)
    with_imm = raw.wc_flags & 2  # IBV_WC_WITH_IMM
    return WC(
        wr_id=raw.wr_id,
        status=status,
        opcode=opcode,
        qp_num=raw.qp_num,
        byte_len=raw.byte_len,
        imm_data=socket.ntohl(raw.imm_data) if with_imm else 0,
        wc_flags=raw.wc_flags,
        src_qp=raw.src_qp,
        vendor_err=raw.vendor_err,
    )


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


def modify_args(
    pv: Pyverbs, port: Port, attr: QPAttr, current: ibv_qp_state, qp_num: int, psn: int
) -> tuple[Any, int]:
    """The pyverbs QPAttr and attribute mask for moving from `current` to attr.qp_state."""
    e = pv.enums
    target = ibv_qp_state(attr.qp_state)
    out = pv.qp.QPAttr(qp_state=int(target), cur_qp_state=int(current), port_num=port.num)
    mask = e.IBV_QP_STATE
    if target == ibv_qp_state.IBV_QPS_INIT:
        out.pkey_index = 0
        out.qp_access_flags = int(attr.qp_access_flags)
        mask |= e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_ACCESS_FLAGS
    elif target == ibv_qp_state.IBV_QPS_RTR:
        peer = peer_of(attr.dest, qp_num)
        out.path_mtu = min(attr.path_mtu, port.active_mtu, int(peer.provider_data.get("mtu", attr.path_mtu)))
        out.dest_qp_num = peer.qpn
        out.rq_psn = (peer.psn if attr.rq_psn is None else attr.rq_psn) & 0xFFFFFF
        out.max_dest_rd_atomic = attr.max_dest_rd_atomic
        out.min_rnr_timer = attr.min_rnr_timer
        out.ah_attr = address_handle(pv, port, peer)
        mask |= (
            e.IBV_QP_AV
            | e.IBV_QP_PATH_MTU
            | e.IBV_QP_DEST_QPN
            | e.IBV_QP_RQ_PSN
            | e.IBV_QP_MAX_DEST_RD_ATOMIC
            | e.IBV_QP_MIN_RNR_TIMER
        )
    elif target == ibv_qp_state.IBV_QPS_RTS and current == ibv_qp_state.IBV_QPS_RTR:
        out.timeout = attr.timeout
        out.retry_cnt = attr.retry_cnt
        out.rnr_retry = attr.rnr_retry
        out.sq_psn = (psn if attr.sq_psn is None else attr.sq_psn) & 0xFFFFFF
        out.max_rd_atomic = attr.max_rd_atomic
        mask |= e.IBV_QP_TIMEOUT | e.IBV_QP_RETRY_CNT | e.IBV_QP_RNR_RETRY | e.IBV_QP_SQ_PSN
        mask |= e.IBV_QP_MAX_QP_RD_ATOMIC
    elif target == ibv_qp_state.IBV_QPS_RTS:  # RTS -> RTS may change only a few things
        out.min_rnr_timer = attr.min_rnr_timer
        mask |= e.IBV_QP_MIN_RNR_TIMER
    return out, mask


def address_handle(pv: Pyverbs, port: Port, peer: Endpoint) -> Any:
    """The path to the peer: by GID through a GRH on RoCE (no LIDs on Ethernet), by LID on InfiniBand."""
    if port.link_layer == "Ethernet":
        route = pv.addr.GlobalRoute(
            dgid=pv.addr.GID(exploded_gid(peer.gid)), sgid_index=port.gid_index, hop_limit=HOP_LIMIT
        )
        return pv.addr.AHAttr(is_global=1, port_num=port.num, gr=route)
    return pv.addr.AHAttr(dlid=int(peer.provider_data.get("lid", 0)), port_num=port.num)
