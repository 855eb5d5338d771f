"""The tcp QP's rule book: the state transitions it takes, the attribute ranges it checks, its Endpoint."""

from __future__ import annotations

from dataclasses import dataclass

from libshift.gid import gid_of_ipv4, ipv4_of_gid
from libshift.vocabulary.attrs import Endpoint, QPAttr
from libshift.vocabulary.enums import ibv_qp_state
from libshift.vocabulary.errors import VerbsError, VerbsRDMAError

S = ibv_qp_state
TRANSITIONS = {
    (S.IBV_QPS_RESET, S.IBV_QPS_INIT),
    (S.IBV_QPS_INIT, S.IBV_QPS_INIT),
    (S.IBV_QPS_INIT, S.IBV_QPS_RTR),
    (S.IBV_QPS_RTR, S.IBV_QPS_RTS),
    (S.IBV_QPS_RTS, S.IBV_QPS_RTS),
}


def tcp_endpoint(device: str, address: str, qpn: int, psn: int) -> Endpoint:
    """A tcp QP's connection data: GID and QPN reach it (the QPN names its listener, qpns.py)."""
    return Endpoint(gid=gid_of_ipv4(address), qpn=qpn, psn=psn, device=device, provider="tcp")


@dataclass(frozen=True)
class Peer:
    address: str  # IPv4, from the GID
    qpn: int
    psn: int  # the first PSN expected from it


def rtr_peer(qp_num: int, attr: QPAttr) -> Peer:
    """The peer RTR connects to: GID, QPN and PSN are all it takes; a VerbsError when they are missing."""
    dest = attr.peer()
    if dest is None:
        raise VerbsError(f"QP {qp_num}: to_rtr needs the peer's GID and QPN (attr.ah_attr and dest_qp_num)")
    try:
        address = ipv4_of_gid(dest.gid)
    except ValueError as exc:
        raise VerbsError(f"QP {qp_num}: {exc}") from None
    return Peer(address, dest.qpn, dest.psn if attr.rq_psn is None else attr.rq_psn)


def check_attr(attr: QPAttr) -> None:
    for name, top in (("timeout", 31), ("retry_cnt", 7), ("rnr_retry", 7), ("min_rnr_timer", 31)):
        value = getattr(attr, name)
        if not 0 <= value <= top:
            raise VerbsRDMAError(f"QP attribute {name}={value} is outside 0..{top}")
