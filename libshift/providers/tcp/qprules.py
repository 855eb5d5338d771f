"""The tcp QP's rule book: the state transitions it takes, the attribute ranges it checks, its Endpoint."""

from __future__ import annotations

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
    """A tcp QP's connection data: the peer connects to `address`, port `qpn`."""
    return Endpoint(
        gid=gid_of_ipv4(address),
        qpn=qpn,
        psn=psn,
        device=device,
        provider="tcp",
        provider_data={"address": address, "port": qpn},
    )


def rtr_peer(qp_num: int, attr: QPAttr) -> tuple[Endpoint, str]:
    """The peer's Endpoint that RTR takes, and its IPv4 address; a VerbsError when it is no tcp QP's."""
    dest = attr.dest
    if dest is None or dest.provider != "tcp" or "port" not in dest.provider_data:
        raise VerbsError(f"QP {qp_num}: to_rtr needs the peer's tcp Endpoint in attr.dest")
    try:
        return dest, ipv4_of_gid(dest.gid)
    except ValueError as exc:
        raise VerbsError(str(exc)) from None


def check_attr(attr: QPAttr) -> None:
    for name, top in (("timeout", 31), ("retry_cnt", 7), ("rnr_retry", 7), ("min_rnr_timer", 31)):
        value = getattr(attr, name)
        if not 0 <= value <= top:
            raise VerbsRDMAError(f"QP attribute {name}={value} is outside 0..{top}")
