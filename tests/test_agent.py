"""libshift.agent against a real shiftd (and a real etcd): events, mappings, reports, restarts."""

import logging
import os
import signal

import pytest
from waiting import wait_until

from libshift.agent import MAPPINGS_PER_CALL, Agent
from libshift.api.shift.v1 import admin_pb2, agent_pb2, common_pb2
from libshift.notices import NicState, SwitchKind, SwitchReport
from libshift.verbs import Endpoint

pytestmark = [pytest.mark.lab, pytest.mark.timeout(120)]


def endpoint(qpn, gid="::ffff:127.0.0.1", device="mlx5_0"):
    return Endpoint(
        gid=gid, qpn=qpn, psn=3, device=device, provider="tcp", provider_data={"port": 40000 + qpn}
    )


@pytest.fixture
def daemon(etcd_daemon):
    return etcd_daemon


def test_events_mappings_and_reports(daemon):
    with Agent.connect(daemon.socket, name="trainer") as a, Agent.connect(daemon.socket, name="peer") as b:
        seen = []
        a.add_listener(seen.append)
        assert wait_until(lambda: a.nic_state("mlx5_0") is NicState.UP)
        assert [(e.device, e.state) for e in seen] == [("mlx5_0", NicState.UP)]
        assert a.host == "t0"

        a.publish_qp(endpoint(7), endpoint(8, gid="::ffff:127.0.0.2", device="mlx5_1"))
        found = b.lookup_qp("::ffff:127.0.0.1", 7, wait=5)
        assert found == endpoint(8, gid="::ffff:127.0.0.2", device="mlx5_1")  # the port comes back an int
        assert b.lookup_qp("::ffff:127.0.0.1", 9) is None
        a.publish_mr("::ffff:127.0.0.1", 0x1234, "::ffff:127.0.0.2", 0x5678)
        mr = b.lookup_mr("::ffff:127.0.0.1", 0x1234, wait=5)
        assert (mr.backup_gid, mr.backup_rkey) == ("::ffff:127.0.0.2", 0x5678)

        a.report(
            SwitchReport(
                kind=SwitchKind.FAILOVER, device="mlx5_0", backup_device="mlx5_1", default_device="mlx5_0",
                reason="nic_event", downtime_seconds=0.004, reposted_work_requests=12, time_unix_nanos=1,
            )
        )  # fmt: skip
        assert a.reports.wait_empty(5)  # sent by a thread: Status may otherwise come first
        with daemon.channel() as channel:
            status = daemon.admin(channel).Status(admin_pb2.StatusRequest(), timeout=10)
            events = list(
                daemon.admin(channel).StreamEvents(admin_pb2.StreamEventsRequest(backlog=20), timeout=10)
            )
        assert status.failovers == 1
        assert {x.name for x in status.agents} == {"trainer", "peer"}
        failovers = [e.failover for e in events if e.WhichOneof("kind") == "failover"]
        assert failovers[0].reposted_work_requests == 12

        a.withdraw_qp(endpoint(7))
        assert b.lookup_qp("::ffff:127.0.0.1", 7) is None


def test_a_request_of_several_reports_counts_each_once(daemon):
    """ReportFailover's `more`: the reports behind the first, numbered on from its seq; sent again, none
    counts twice, and one new report behind them counts alone."""

    def report(ms: int) -> common_pb2.FailoverReport:
        return common_pb2.FailoverReport(
            kind=common_pb2.FAILOVER_KIND_FAILOVER, device="mlx5_0", backup_device="mlx5_1",
            default_device="mlx5_0", reason="nic_event", downtime_seconds=ms / 1000, qps=1,
        )  # fmt: skip

    with daemon.channel() as channel:
        stub = daemon.agent(channel)
        registered = stub.Register(agent_pb2.RegisterRequest(pid=os.getpid(), name="storm"), timeout=10)
        agent_id = registered.agent_id

        def send(seq: int, *ms: int) -> bool:
            request = agent_pb2.ReportFailoverRequest(
                agent_id=agent_id, instance="i1", seq=seq, report=report(ms[0]), more=map(report, ms[1:])
            )
            return stub.ReportFailover(request, timeout=10).duplicate

        assert send(1, 1, 2, 3) is False
        assert send(1, 1, 2, 3) is True  # its answer was lost: all three again
        assert send(2, 2, 3, 4) is False  # only 4 is new
        admin = daemon.admin(channel)
        status = admin.Status(admin_pb2.StatusRequest(), timeout=10)
        events = list(admin.StreamEvents(admin_pb2.StreamEventsRequest(backlog=20), timeout=10))
    assert status.failovers == 4
    downtimes = [e.failover.downtime_seconds for e in events if e.WhichOneof("kind") == "failover"]
    assert downtimes == [0.001, 0.002, 0.003, 0.004]


def test_agent_survives_a_daemon_restart_and_republishes(daemon):
    agent = Agent.connect(daemon.socket, name="long-lived")
    try:
        agent.publish_qp(endpoint(21), endpoint(22, device="mlx5_1"))
        for rkey in range(1, MAPPINGS_PER_CALL + 10):  # more than one Publish call may carry
            agent.publish_mr("::ffff:127.0.0.1", rkey, "::ffff:127.0.0.2", rkey + 1)
        daemon.stop(signal.SIGKILL)
        daemon.start()
        assert wait_until(lambda: agent.reconnects >= 1, timeout=15)
        with daemon.channel() as channel:  # the new daemon knows the mapping: it was published again
            agents = daemon.admin(channel).Status(admin_pb2.StatusRequest(), timeout=10).agents
        assert [(x.name, x.qp_mappings, x.mr_mappings) for x in agents] == [
            ("long-lived", 1, MAPPINGS_PER_CALL + 9)
        ]
        with Agent.connect(daemon.socket, name="other") as other:
            assert other.lookup_qp("::ffff:127.0.0.1", 21, wait=10) == endpoint(22, device="mlx5_1")
        assert wait_until(lambda: agent.nic_state("mlx5_0") is NicState.UP)
    finally:
        agent.close()


def test_without_daemon_connect_says_why_and_returns_none(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="libshift.agent"):
        assert Agent.connect(str(tmp_path / "absent.sock")) is None
    assert "running without failover" in caplog.text
