"""What shiftd and libshift tell each other, in the library's own words: a NIC's change of state (shiftd's
event stream) and a QP's move between paths (reported to shiftd for metrics and `shiftctl events`).

The agent (libshift/agent.py) is the one place that turns protobuf into these and back; the failover layer
(libshift/shift) reads and builds only these. Plain values that import nothing of libshift, so that both the
agent and the failover layer stand on them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class NicState(enum.Enum):
    UNKNOWN = "unknown"  # shiftd has said nothing of the device yet (or a state this library does not know)
    UP = "up"  # up and stable past shiftd's hold-down
    DOWN = "down"
    DEGRADED = "degraded"  # link up, not fully healthy


@dataclass(frozen=True, slots=True)
class NicChange:
    """shiftd's word that `device` is now in `state`."""

    device: str
    state: NicState
    reason: str = ""
    monotonic_nanos: int = 0  # when shiftd saw it, on CLOCK_MONOTONIC (one clock per host: for latency)
    host: str = ""  # the host whose NIC it is (another than ours: a peer's, told with its GID)
    gid: str = ""
    move_off: bool = False  # DEGRADED by the loss of its own traffic, a healthy NIC beside it: leave it
    previous_gid: str = ""  # a peer's NIC re-addressed: the GID it had (`gid` is the new one)


class SwitchKind(enum.Enum):
    FAILOVER = "failover"  # away from the default device
    FAILBACK = "failback"  # back onto it


@dataclass(frozen=True, slots=True)
class SwitchReport:
    """One QP's move from `device` to `backup_device`, measured from detection to resume."""

    kind: SwitchKind
    device: str  # the device traffic left
    backup_device: str  # the device traffic went to
    default_device: str  # the QP's own device
    reason: str  # nic_event, error_completion, peer_notification, nic_recovered
    downtime_seconds: float
    reposted_work_requests: int  # receives moved, and sends posted again that had gone out on the path left
    time_unix_nanos: int
    qps: int = 1
