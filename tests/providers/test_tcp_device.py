"""The tcp device's answers to query_device and query_port: its limits, and its netdev's state as the
port's."""

from __future__ import annotations

from libshift.providers.tcp.context import LIMITS
from libshift.providers.tcp.netdev import netdev_port
from libshift.verbs import Context, ibv_port_state


def test_the_device_answers_its_limits(lo_context: Context) -> None:
    attr = lo_context.query_device()
    assert attr == LIMITS
    assert attr.max_cqe >= 1 << 16 and attr.max_sge == 64 and attr.max_qp_wr >= 1 << 15


def test_the_port_is_active_while_the_netdev_is_up(lo_context: Context) -> None:
    assert lo_context.query_port().state == ibv_port_state.IBV_PORT_ACTIVE


def test_a_netdev_that_is_gone_is_a_port_that_is_down() -> None:
    assert netdev_port("nosuchnetdev0", None).state == ibv_port_state.IBV_PORT_DOWN
