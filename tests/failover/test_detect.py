"""The default path's detection deadline: short unless the application's is shorter; set in verbs terms."""

from __future__ import annotations

import pytest

from libshift.shift.detect import RETRY_CNT, TIMEOUT, default_path_attr
from libshift.verbs import QPAttr, VerbsError
from libshift.verbs.attrs import ack_deadline


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
