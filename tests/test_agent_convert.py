"""The agent's conversions between shiftd's protobuf and the library's values, field by field."""

from __future__ import annotations

import pytest

from libshift.agent import failover_report, nic_change
from libshift.api.shift.v1 import common_pb2
from libshift.notices import NicChange, NicState, SwitchKind, SwitchReport


@pytest.mark.parametrize(
    ("proto", "state"),
    [
        (common_pb2.NIC_STATE_UP, NicState.UP),
        (common_pb2.NIC_STATE_DOWN, NicState.DOWN),
        (common_pb2.NIC_STATE_DEGRADED, NicState.DEGRADED),
        (common_pb2.NIC_STATE_UNSPECIFIED, NicState.UNKNOWN),
        (77, NicState.UNKNOWN),  # a state a newer shiftd may send
    ],
)
def test_a_nic_event_becomes_a_nic_change(proto: int, state: NicState) -> None:
    event = common_pb2.NicEvent(
        host="h0",
        device="mlx5_0",
        netdev="eth0",
        state=proto,
        previous_state=common_pb2.NIC_STATE_UP,
        reason="carrier lost",
        time_unix_nanos=1_700_000_000_000_000_000,
        monotonic_nanos=123_456_789,
        gid="::ffff:198.18.0.10",
    )
    assert nic_change(event) == NicChange(
        device="mlx5_0",
        state=state,
        reason="carrier lost",
        monotonic_nanos=123_456_789,
        host="h0",
        gid="::ffff:198.18.0.10",
    )


@pytest.mark.parametrize(
    ("kind", "proto"),
    [
        (SwitchKind.FAILOVER, common_pb2.FAILOVER_KIND_FAILOVER),
        (SwitchKind.FAILBACK, common_pb2.FAILOVER_KIND_FAILBACK),
    ],
)
def test_a_switch_report_becomes_a_failover_report(kind: SwitchKind, proto: int) -> None:
    fields = {  # the same names on both sides
        "device": "mlx5_0",
        "backup_device": "mlx5_2",
        "default_device": "mlx5_0",
        "reason": "nic_event",
        "downtime_seconds": 0.0042,
        "reposted_work_requests": 17,
        "time_unix_nanos": 1_700_000_000_000_000_001,
        "qps": 3,
    }
    message = failover_report(SwitchReport(kind=kind, **fields))  # type: ignore[arg-type]
    assert message == common_pb2.FailoverReport(kind=proto, **fields)
    assert {name: getattr(message, name) for name in fields} == fields
    # every field of the proto is one the report sets: a field added to FailoverReport fails here
    assert {f.name for f, _ in message.ListFields()} == {f.name for f in message.DESCRIPTOR.fields}


def test_a_nic_change_is_frozen() -> None:
    change = NicChange(device="mlx5_0", state=NicState.UP)
    with pytest.raises(AttributeError):
        change.state = NicState.DOWN  # type: ignore[misc]
