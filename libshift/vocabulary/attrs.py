"""QP attributes and the Endpoint, the connection data the application exchanges to connect two QPs.

A peer QP is named by GID, QPN and PSN, as on RoCE: either as pyverbs spells them (QPAttr.ah_attr =
AHAttr(gr=GlobalRoute(dgid=...)), dest_qp_num, rq_psn) or all three at once as an Endpoint in QPAttr.dest.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from libshift.vocabulary.enums import ibv_mtu, ibv_port_state, ibv_qp_state
from libshift.vocabulary.errors import VerbsError


@dataclass(frozen=True)
class Endpoint:
    """What a peer needs to connect to a QP: GID, QPN and first PSN, as on RoCE; which device and provider
    made it (for the shift layer's lookups), and data a provider needs beyond those three (the verbs
    provider: LID and MTU; none on tcp; the shift layer adds its notification target).

    The application exchanges it through its own channel, as it would exchange GID/QPN/PSN with real RDMA;
    to_json/from_json give it a portable form.
    """

    gid: str
    qpn: int
    psn: int
    device: str = ""
    provider: str = ""
    provider_data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Endpoint:
        return cls(**json.loads(text))


@dataclass
class QPCap:
    """Queue sizes; posting past max_send_wr/max_recv_wr is refused with ENOMEM, as ibverbs does."""

    max_send_wr: int = 128
    max_recv_wr: int = 128
    max_send_sge: int = 16
    max_recv_sge: int = 16
    max_inline_data: int = 256


@dataclass(frozen=True)
class DeviceAttr:
    """A device's limits, as ibv_query_device answers them: the part that sizes queues (rxe: 32767 CQEs,
    32 SGEs; mlx5: about 4M CQEs, 30 SGEs)."""

    max_cqe: int
    max_sge: int
    max_qp_wr: int


@dataclass(frozen=True)
class PortAttr:
    """A port's attributes, as ibv_query_port answers them: its state (ACTIVE while it carries traffic) and
    its MTU (tcp: no path MTU of its own, so the largest)."""

    state: ibv_port_state
    active_mtu: ibv_mtu = ibv_mtu.IBV_MTU_4096


def retry_period(timeout: int) -> float | None:
    """Seconds of one try of the ack deadline (IB: 4.096 us x 2**timeout); None for timeout 0 (forever)."""
    return None if timeout == 0 else 4.096e-6 * (1 << timeout)


def ack_deadline(timeout: int, retry_cnt: int) -> float | None:
    """Seconds without an ack before RETRY_EXC_ERR: retry_cnt + 1 tries; None for timeout 0 (forever)."""
    period = retry_period(timeout)
    return None if period is None else period * (retry_cnt + 1)


class GID(str):
    """A GID, as pyverbs' GID(val=...) and its .gid spell it, that is also its text."""

    def __new__(cls, val: str | None = None) -> GID:
        return super().__new__(cls, "::" if val is None else str(val))

    @property
    def gid(self) -> str:
        return str(self)


@dataclass
class GlobalRoute:
    """The GRH part of an address (ibv_global_route): on RoCE, and here, the peer's GID."""

    dgid: GID | str | None = None
    flow_label: int = 0
    sgid_index: int = 0
    hop_limit: int = 1
    traffic_class: int = 0


@dataclass
class AHAttr:
    """A path to the peer (ibv_ah_attr): RoCE needs the global route, `gr`, with is_global set."""

    dlid: int = 0
    sl: int = 0
    src_path_bits: int = 0
    static_rate: int = 0
    is_global: int = 0
    port_num: int = 1
    gr: GlobalRoute | None = None

    def __post_init__(self) -> None:
        if self.is_global and self.gr is None:
            raise VerbsError("AHAttr: is_global is set but gr (a GlobalRoute) is None")


@dataclass
class QPAttr:
    """Attributes for a state transition, with pyverbs' field names (its first four in its order).

    RTR needs the peer: pyverbs' ah_attr (AHAttr with a GlobalRoute whose dgid is the peer's GID) and
    dest_qp_num, or an Endpoint in `dest` (which, when given, names GID and QPN). rq_psn, when given, is
    the peer's first PSN, else dest.psn; sq_psn, when given, is ours, else the one our Endpoint offered.
    timeout and retry_cnt give the ack deadline (4.096 us x 2**timeout per try, retry_cnt + 1 tries;
    timeout 0 waits forever); rnr_retry 7 waits for a receive forever; min_rnr_timer is IB's encoded delay.
    Defaults differ from pyverbs' zeroed struct where zero would be a poor start (timeout 0 = no deadline).
    """

    qp_state: ibv_qp_state = ibv_qp_state.IBV_QPS_RESET
    cur_qp_state: ibv_qp_state = ibv_qp_state.IBV_QPS_RESET
    port_num: int = 1
    path_mtu: int = ibv_mtu.IBV_MTU_4096
    qp_access_flags: int = 0
    pkey_index: int = 0
    ah_attr: AHAttr | None = None
    dest_qp_num: int | None = None
    dest: Endpoint | None = None
    rq_psn: int | None = None
    sq_psn: int | None = None
    timeout: int = 14
    retry_cnt: int = 7
    rnr_retry: int = 7
    min_rnr_timer: int = 12
    max_rd_atomic: int = 16
    max_dest_rd_atomic: int = 16

    def peer(self) -> Endpoint | None:
        """The peer RTR connects to: `dest`, else pyverbs' ah_attr.gr.dgid, dest_qp_num and rq_psn
        (None when those are incomplete)."""
        if self.dest is not None:
            return self.dest
        route = self.ah_attr.gr if self.ah_attr is not None else None
        if route is None or route.dgid is None or self.dest_qp_num is None:
            return None
        return Endpoint(gid=str(route.dgid), qpn=self.dest_qp_num, psn=self.rq_psn or 0)
