"""The default path's detection deadline: short unless the application's is shorter; set in verbs terms. And
which error completions are the transport failing (a failover) rather than the application's error."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from libshift.notices import NicState
from libshift.shift.detect import (
    RETRY_CNT,
    TIMEOUT,
    TRANSPORT_ERRORS,
    Verdict,
    default_path_attr,
    device_usable,
    judge,
    reconsider,
)
from libshift.verbs import PortAttr, QPAttr, VerbsError, ack_deadline, ibv_port_state, ibv_wc_status


def test_the_verbs_default_deadline_becomes_the_detection_deadline() -> None:
    attr = default_path_attr(QPAttr())  # timeout 14, retry_cnt 7: 537 ms
    assert (attr.timeout, attr.retry_cnt) == (TIMEOUT, RETRY_CNT)
    assert ack_deadline(attr.timeout, attr.retry_cnt) < 0.1


@pytest.mark.parametrize(("timeout", "retry_cnt"), [(0, 7), (20, 7), (13, 2)])
def test_a_longer_or_infinite_deadline_is_shortened(timeout: int, retry_cnt: int) -> None:
    attr = default_path_attr(QPAttr(timeout=timeout, retry_cnt=retry_cnt, rnr_retry=3))
    assert (attr.timeout, attr.retry_cnt, attr.rnr_retry) == (TIMEOUT, RETRY_CNT, 3)


def test_a_shorter_deadline_of_the_application_is_kept() -> None:
    mine = QPAttr(timeout=10, retry_cnt=2)
    assert default_path_attr(mine) is mine


def test_the_environment_sets_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHIFT_DETECT_TIMEOUT", "13")
    monkeypatch.setenv("SHIFT_DETECT_RETRY_CNT", "1")
    attr = default_path_attr(QPAttr())
    assert (attr.timeout, attr.retry_cnt) == (13, 1)


@pytest.mark.parametrize(("name", "value"), [("SHIFT_DETECT_TIMEOUT", "0"), ("SHIFT_DETECT_TIMEOUT", "x"),
                                             ("SHIFT_DETECT_RETRY_CNT", "8")])  # fmt: skip
def test_a_bad_setting_is_one_clear_error(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(VerbsError, match=f"{name} must be an integer from .* not '{value}'"):
        default_path_attr(QPAttr())


# -- which error completions are the transport's -------------------------------------------------------------


@dataclass
class FakeDevice:
    """A device whose port state the test sets; None: its port cannot be queried (a device that is gone)."""

    state: ibv_port_state | None = ibv_port_state.IBV_PORT_ACTIVE

    def query_port(self, port_num: int = 1) -> PortAttr:
        if self.state is None:
            raise VerbsError("mlx5_0: query_port 1 failed: No such device")
        return PortAttr(self.state)


def asks(answer: bool) -> tuple[Callable[[], bool], list[bool]]:
    """A `usable` that answers `answer` and records that it was asked."""
    asked: list[bool] = []

    def usable() -> bool:
        asked.append(True)
        return answer

    return usable, asked


@pytest.mark.parametrize("status", sorted(TRANSPORT_ERRORS))
def test_the_transport_statuses_fail_over_whatever_the_device_says(status: ibv_wc_status) -> None:
    usable, asked = asks(True)
    assert judge(status, usable) is Verdict.TRANSPORT
    assert not asked  # the device's state is asked only when the status alone does not tell


def test_a_local_qp_operation_error_fails_over_on_a_device_that_is_not_usable_else_is_in_doubt() -> None:
    """rxe answers LOC_QP_OP_ERR when its netdev goes down, and also to a bad lkey or a short receive."""
    assert judge(ibv_wc_status.IBV_WC_LOC_QP_OP_ERR, asks(False)[0]) is Verdict.TRANSPORT
    assert judge(ibv_wc_status.IBV_WC_LOC_QP_OP_ERR, asks(True)[0]) is Verdict.DOUBT


def test_a_doubt_is_the_transports_once_the_device_fails_and_the_applications_after_its_grace() -> None:
    """rxe fails the WRs of a netdev going down before its port reads DOWN: the device is asked again."""
    assert reconsider(9.0, 10.0, asks(True)[0]) is Verdict.DOUBT
    assert reconsider(9.5, 10.0, asks(False)[0]) is Verdict.TRANSPORT
    assert reconsider(10.0, 10.0, asks(True)[0]) is Verdict.APPLICATION
    assert reconsider(10.0, 10.0, asks(False)[0]) is Verdict.TRANSPORT  # a failed device wins at the end


@pytest.mark.parametrize(
    "status",
    [
        ibv_wc_status.IBV_WC_LOC_PROT_ERR,
        ibv_wc_status.IBV_WC_LOC_LEN_ERR,
        ibv_wc_status.IBV_WC_REM_ACCESS_ERR,
    ],
)
def test_the_applications_errors_never_fail_over(status: ibv_wc_status) -> None:
    usable, asked = asks(False)
    assert judge(status, usable) is Verdict.APPLICATION
    assert not asked


@pytest.mark.parametrize(
    ("state", "nic", "usable"),
    [
        (ibv_port_state.IBV_PORT_ACTIVE, NicState.UNKNOWN, True),  # no shiftd: the port alone tells
        (ibv_port_state.IBV_PORT_ACTIVE, NicState.UP, True),
        (ibv_port_state.IBV_PORT_ACTIVE, NicState.DOWN, False),  # shiftd knows before the port says
        (ibv_port_state.IBV_PORT_DOWN, NicState.UNKNOWN, False),
        (ibv_port_state.IBV_PORT_DOWN, NicState.UP, False),  # the port's word is newer than shiftd's
        (ibv_port_state.IBV_PORT_INIT, NicState.UNKNOWN, False),
        (None, NicState.UNKNOWN, False),  # a device that cannot be queried is of no use
    ],
)
def test_a_device_is_usable_while_its_port_is_active_and_shiftd_has_not_said_down(
    state: ibv_port_state | None, nic: NicState, usable: bool
) -> None:
    assert device_usable(FakeDevice(state), nic) is usable  # type: ignore[arg-type]
