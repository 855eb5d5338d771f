"""The default path's ack deadline: how soon a silent failure of the default NIC is noticed.

A link that goes down shows at once through shiftd's NIC event. A black hole (link and carrier up, packets
dropped: a bad switch port, a broken cable half, a misprogrammed route) shows only through the ack deadline
of the QPs using it. The application's own setting is sized for a QP with nowhere else to go (the verbs
default, timeout 14 and retry_cnt 7, waits 537 ms; NCCL's 20 and 7 wait 37 s). A shift QP with a backup can
afford a short one on its default path: a false alarm costs a move to the backup, not the job. The backup
path keeps the application's setting, so a QP with no path left fails exactly when the application asked.

`SHIFT_DETECT_TIMEOUT` and `SHIFT_DETECT_RETRY_CNT` set it in the verbs' own terms (as NCCL_IB_TIMEOUT and
NCCL_IB_RETRY_CNT do): 4.096 us x 2**timeout per try, retry_cnt + 1 tries.

An error completion is the transport's (a failover) or the application's (it surfaces): `judge` tells them
apart, with the device's state for the one status that can be either. That one, on a device that still looks
usable, is in doubt until the device fails (the transport's) or EITHER_GRACE has passed (the
application's): `reconsider` says which, doubt.py holds it meanwhile.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable

from libshift.notices import NicState
from libshift.shift.settings import env_int
from libshift.verbs import Context, QPAttr, VerbsError, ack_deadline, ibv_port_state, ibv_wc_status

ST = ibv_wc_status
TRANSPORT_ERRORS = frozenset(
    {
        ST.IBV_WC_RETRY_EXC_ERR,
        ST.IBV_WC_WR_FLUSH_ERR,
        ST.IBV_WC_FATAL_ERR,
        ST.IBV_WC_GENERAL_ERR,
        ST.IBV_WC_RESP_TIMEOUT_ERR,
        ST.IBV_WC_REM_ABORT_ERR,
        ST.IBV_WC_BAD_RESP_ERR,
    }
)
# rxe's answer both when its netdev goes down and to a bad lkey or a short receive (the application's bug,
# which must not fail over): the transport's only while the device is not usable
EITHER = ST.IBV_WC_LOC_QP_OP_ERR
# rxe fails the WRs of a netdev going down before it marks the port DOWN, and shiftd's word comes later
# still (0.3 s apart were seen under emulation): the device is asked again, about every EITHER_ASK_EVERY, for
# this long before an EITHER on a device that looks usable is called the application's (a bug's error
# surfaces that much later)
EITHER_GRACE, EITHER_ASK_EVERY = 1.0, 0.01

TIMEOUT = 12  # 16.8 ms per try ...
RETRY_CNT = 3  # ... 4 tries: 67 ms from the last ack to the move


def _deadline(timeout: int, retry_cnt: int) -> float:
    """ack_deadline with "forever" as infinity, so that deadlines compare."""
    seconds = ack_deadline(timeout, retry_cnt)
    return math.inf if seconds is None else seconds


def default_path_attr(attr: QPAttr) -> QPAttr:
    """`attr` with the detection deadline on the default path, unless the application's is shorter."""
    timeout = env_int("SHIFT_DETECT_TIMEOUT", TIMEOUT, 1, 31)
    retry_cnt = env_int("SHIFT_DETECT_RETRY_CNT", RETRY_CNT, 0, 7)
    if _deadline(attr.timeout, attr.retry_cnt) <= _deadline(timeout, retry_cnt):
        return attr
    return dataclasses.replace(attr, timeout=timeout, retry_cnt=retry_cnt)


class Verdict(enum.Enum):
    TRANSPORT = "transport"  # the path failed: move the QP
    APPLICATION = "application"  # the application's error: it surfaces
    DOUBT = "doubt"  # not yet known: hold it and ask the device again


def surfaces(verdict: Verdict) -> str:
    """Why an error completion with `verdict` breaks its QP instead of moving it (when it was not moved)."""
    return "the application's error" if verdict is Verdict.APPLICATION else "no armed path to move to"


def judge(status: ibv_wc_status, usable: Callable[[], bool]) -> Verdict:
    """Whose an error completion is; `usable` says whether the completion's device still works, asked only
    if the status alone does not tell."""
    if status in TRANSPORT_ERRORS:
        return Verdict.TRANSPORT
    if status != EITHER:
        return Verdict.APPLICATION
    return Verdict.DOUBT if usable() else Verdict.TRANSPORT


def reconsider(now: float, until: float, usable: Callable[[], bool]) -> Verdict:
    """A DOUBT's verdict at `now`: the transport's once the device is not usable, else the application's from
    `until` on (doubt.py holds the error meanwhile)."""
    if not usable():
        return Verdict.TRANSPORT
    return Verdict.APPLICATION if now >= until else Verdict.DOUBT


def device_usable(device: Context, nic: NicState) -> bool:
    """Whether `device` can carry traffic: shiftd has not said DOWN, and its port is ACTIVE."""
    if nic is NicState.DOWN:
        return False
    try:
        return device.query_port().state == ibv_port_state.IBV_PORT_ACTIVE
    except VerbsError:
        return False  # a device that cannot be asked is of no use either
