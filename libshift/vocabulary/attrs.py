"""QP attributes and the Endpoint, the connection data the application exchanges to connect two QPs."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from libshift.vocabulary.enums import ibv_port_state, ibv_qp_state


@dataclass(frozen=True)
class Endpoint:
    """What a peer needs to connect to a QP: GID, QPN, first PSN, device, and provider data (tcp: port).

    The application exchanges it through its own channel, as it would exchange LID/GID/QPN with real RDMA;
    to_json/from_json give it a portable form.
    """

    gid: str
    qpn: int
    psn: int
    device: str
    provider: str
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
    """A port's attributes, as ibv_query_port answers them: its state (ACTIVE while it carries traffic)."""

    state: ibv_port_state


def retry_period(timeout: int) -> float | None:
    """Seconds of one try of the ack deadline (IB: 4.096 us x 2**timeout); None for timeout 0 (forever)."""
    return None if timeout == 0 else 4.096e-6 * (1 << timeout)


def ack_deadline(timeout: int, retry_cnt: int) -> float | None:
    """Seconds without an ack before RETRY_EXC_ERR: retry_cnt + 1 tries; None for timeout 0 (forever)."""
    period = retry_period(timeout)
    return None if period is None else period * (retry_cnt + 1)


@dataclass
class QPAttr:
    """Attributes for a state transition; `dest` (the peer's Endpoint) is what RTR needs.

    timeout and retry_cnt give the ack deadline (4.096 us x 2**timeout per try, retry_cnt + 1 tries;
    timeout 0 waits forever); rnr_retry 7 waits for a receive forever; min_rnr_timer is IB's encoded delay.
    """

    qp_state: ibv_qp_state = ibv_qp_state.IBV_QPS_RESET
    qp_access_flags: int = 0
    dest: Endpoint | None = None
    rq_psn: int | None = None
    sq_psn: int | None = None
    timeout: int = 14
    retry_cnt: int = 7
    rnr_retry: int = 7
    min_rnr_timer: int = 12
    max_rd_atomic: int = 16
    max_dest_rd_atomic: int = 16
    path_mtu: int = 5
