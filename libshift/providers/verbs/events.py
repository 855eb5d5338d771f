"""Async events of an RNIC, and what each means to the resilience layer.

ibv_get_async_event reports port, device, QP and CQ events; pyverbs (rdma-core 44) hands over only the
event type, not the element, so an event names its device and the context finds the port or QPs itself
(it re-queries them). The mapping is pure, so it is tested without hardware.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("libshift.providers.verbs")


class EventType(enum.IntEnum):
    """enum ibv_event_type, with its values."""

    CQ_ERR = 0
    QP_FATAL = 1
    QP_REQ_ERR = 2
    QP_ACCESS_ERR = 3
    COMM_EST = 4
    SQ_DRAINED = 5
    PATH_MIG = 6
    PATH_MIG_ERR = 7
    DEVICE_FATAL = 8
    PORT_ACTIVE = 9
    PORT_ERR = 10
    LID_CHANGE = 11
    PKEY_CHANGE = 12
    SM_CHANGE = 13
    SRQ_ERR = 14
    SRQ_LIMIT_REACHED = 15
    QP_LAST_WQE_REACHED = 16
    CLIENT_REREGISTER = 17
    GID_CHANGE = 18
    WQ_FATAL = 19


class Scope(enum.Enum):
    PORT = "port"
    DEVICE = "device"
    QP = "qp"
    CQ = "cq"
    OTHER = "other"


@dataclass(frozen=True)
class Meaning:
    """What an event tells: `nic_up` False (the NIC cannot carry traffic), True (it can again), None
    (nothing about the NIC); `readdress` when the port's GID index or LID must be read again."""

    scope: Scope
    nic_up: bool | None = None
    readdress: bool = False
    qp_error: bool = False  # a QP went to ERR: error completions follow (detection source 2)


MEANINGS: dict[EventType, Meaning] = {
    EventType.PORT_ERR: Meaning(Scope.PORT, nic_up=False),
    EventType.PORT_ACTIVE: Meaning(Scope.PORT, nic_up=True, readdress=True),  # indices move after a flap
    EventType.GID_CHANGE: Meaning(Scope.PORT, readdress=True),
    EventType.LID_CHANGE: Meaning(Scope.PORT, readdress=True),
    EventType.CLIENT_REREGISTER: Meaning(Scope.PORT, readdress=True),
    EventType.PKEY_CHANGE: Meaning(Scope.PORT),
    EventType.SM_CHANGE: Meaning(Scope.PORT),
    EventType.DEVICE_FATAL: Meaning(Scope.DEVICE, nic_up=False),  # the context must be opened again
    EventType.QP_FATAL: Meaning(Scope.QP, qp_error=True),
    EventType.QP_REQ_ERR: Meaning(Scope.QP, qp_error=True),
    EventType.QP_ACCESS_ERR: Meaning(Scope.QP, qp_error=True),
    EventType.PATH_MIG_ERR: Meaning(Scope.QP, qp_error=True),
    EventType.COMM_EST: Meaning(Scope.QP),
    EventType.SQ_DRAINED: Meaning(Scope.QP),
    EventType.PATH_MIG: Meaning(Scope.QP),
    EventType.QP_LAST_WQE_REACHED: Meaning(Scope.QP),
    EventType.CQ_ERR: Meaning(Scope.CQ, qp_error=True),  # an overrun CQ: its QPs go to ERR
    EventType.SRQ_ERR: Meaning(Scope.OTHER),
    EventType.SRQ_LIMIT_REACHED: Meaning(Scope.OTHER),
    EventType.WQ_FATAL: Meaning(Scope.OTHER),
}
UNKNOWN = Meaning(Scope.OTHER)


@dataclass(frozen=True)
class AsyncEvent:
    """An async event as the provider surfaces it; `event_type` is the raw value, `type` its name if known.

    `port` is the context's port for port events; `qp_nums` the QPs of the context found in ERR after a
    QP or CQ event.
    """

    device: str
    event_type: int
    meaning: Meaning
    port: int | None = None
    qp_nums: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        try:
            return EventType(self.event_type).name
        except ValueError:
            return f"UNKNOWN_{self.event_type}"


def meaning_of(event_type: int) -> Meaning:
    """What the event of this raw type means (UNKNOWN for types newer than this table)."""
    try:
        return MEANINGS[EventType(event_type)]
    except ValueError:
        return UNKNOWN


def describe(
    device: str, event_type: int, port: int, failed_qps: Callable[[], tuple[int, ...]]
) -> AsyncEvent:
    """The event as surfaced: port events name the context's port, QP and CQ errors the QPs now in ERR
    (`failed_qps` queries them; it is called only for those)."""
    meaning = meaning_of(event_type)
    on_port = port if meaning.scope in (Scope.PORT, Scope.DEVICE) else None
    return AsyncEvent(device, event_type, meaning, on_port, failed_qps() if meaning.qp_error else ())


Listener = Callable[[AsyncEvent], None]


class Listeners:
    """Who hears a device's async events; one failing listener neither stops the others nor the reader."""

    def __init__(self) -> None:
        self._listeners: list[Listener] = []

    def add(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def emit(self, event: AsyncEvent) -> None:
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:
                log.exception("%s: a listener of async event %s failed", event.device, event.name)
