"""libshift.agent against a stand-in shiftd in this process: what a reconnect brings back (every NIC's state,
the QPs' paths) and the failover reports that wait for shiftd, sent again under their ids."""

from __future__ import annotations

import socket
import threading
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from waiting import wait_until

from libshift.agent import REPORTS_PER_CALL, Agent, AgentError
from libshift.api.shift.v1 import agent_pb2, agent_pb2_grpc, common_pb2
from libshift.notices import NicState, SwitchKind, SwitchReport
from libshift.verbs import Endpoint

UP, DOWN = common_pb2.NIC_STATE_UP, common_pb2.NIC_STATE_DOWN


class StandIn(agent_pb2_grpc.AgentServicer):
    """The agent service of a shiftd: NIC states to start each stream with, and a record of the calls."""

    def __init__(self, path: Path, nics: dict[str, int], peers: tuple[common_pb2.NicEvent, ...] = ()) -> None:
        self.nics = nics
        self.peers = peers  # peer hosts' NICs that are down, as shiftd follows them in etcd
        self.registers: list[agent_pb2.RegisterRequest] = []
        self.calls: list[agent_pb2.ReportFailoverRequest] = []  # ReportFailover's requests, as they came
        self.reports: list[agent_pb2.ReportFailoverRequest] = []  # the same, a request per report
        self.published: list[agent_pb2.PublishRequest] = []
        self.lose_answers = 0  # this many report answers are lost (the report itself arrives)
        self._stopped = threading.Event()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        agent_pb2_grpc.add_AgentServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix:{path}")
        self.server.start()

    def stop(self) -> None:
        self._stopped.set()
        self.server.stop(0)

    def Register(self, request, context):
        self.registers.append(request)
        return agent_pb2.RegisterResponse(agent_id=f"a{len(self.registers)}", host="t0")

    def issued(self) -> set[str]:
        return {f"a{n}" for n in range(1, len(self.registers) + 1)}

    def Unregister(self, request, context):
        return agent_pb2.UnregisterResponse()

    def WatchNicEvents(self, request, context):
        if request.agent_id not in self.issued():  # as shiftd: an agent registered with another daemon
            context.abort(grpc.StatusCode.NOT_FOUND, f"no agent {request.agent_id!r} is registered")
        for device, state in self.nics.items():
            yield common_pb2.NicEvent(device=device, state=state, reason="snapshot")
        yield from self.peers
        while context.is_active() and not self._stopped.wait(0.05):
            pass

    def Publish(self, request, context):
        self.published.append(request)
        return agent_pb2.PublishResponse(stored=True)

    def LookupQp(self, request, context):
        context.abort(grpc.StatusCode.NOT_FOUND, "none")

    def ReportFailover(self, request, context):
        if request.agent_id not in self.issued():  # as shiftd: register first (the agent tries again)
            context.abort(grpc.StatusCode.NOT_FOUND, f"no agent {request.agent_id!r} is registered")
        self.calls.append(request)
        self.reports += one_by_one(request)
        if self.lose_answers:
            self.lose_answers -= 1
            context.abort(grpc.StatusCode.UNAVAILABLE, "the answer is lost")
        return agent_pb2.ReportFailoverResponse()


def one_by_one(request: agent_pb2.ReportFailoverRequest) -> list[agent_pb2.ReportFailoverRequest]:
    """A request that carries several reports as the requests of one report each, under their ids."""
    split = []
    for i, report in enumerate([request.report, *request.more]):
        one = agent_pb2.ReportFailoverRequest()
        one.CopyFrom(request)
        one.ClearField("more")
        one.report.CopyFrom(report)
        one.seq = request.seq + i
        split.append(one)
    return split


def switch(kind: SwitchKind = SwitchKind.FAILOVER) -> SwitchReport:
    return SwitchReport(
        kind=kind, device="mlx5_0", backup_device="mlx5_1", default_device="mlx5_0", reason="nic_event",
        downtime_seconds=0.001, reposted_work_requests=0, time_unix_nanos=1,
    )  # fmt: skip


@pytest.fixture
def path(tmp_path) -> Path:
    return tmp_path / "shiftd.sock"


@pytest.fixture
def daemons(path):
    """Start stand-ins on one socket path, one after the other (each a daemon restart); all stopped after."""
    started: list[StandIn] = []

    def start(peers: tuple[common_pb2.NicEvent, ...] = (), **nics: int) -> StandIn:
        started.append(StandIn(path, nics, peers))
        return started[-1]

    yield start
    for daemon in started:
        daemon.stop()


def kinds(requests) -> list[tuple[int, int]]:
    return [(r.seq, r.report.kind) for r in requests]


def test_a_reconnect_starts_with_every_nics_state_and_says_where_the_qps_run(path, daemons):
    first = daemons(mlx5_0=UP, mlx5_1=UP)
    with Agent.connect(str(path)) as agent:
        seen = []
        agent.add_listener(lambda change: seen.append((change.device, change.state)))
        agent.add_path_source(lambda: {("mlx5_0", "mlx5_1"): 2, ("mlx5_0", "mlx5_0"): 1})
        assert wait_until(lambda: len(seen) == 2)
        first.stop()
        second = daemons(mlx5_0=DOWN, mlx5_1=UP)  # mlx5_0 failed while the agent was away
        assert wait_until(lambda: agent.reconnects == 1, timeout=10)
        assert wait_until(lambda: ("mlx5_0", NicState.DOWN) in seen)  # the listeners act on what they missed
        assert agent.nic_state("mlx5_0") is NicState.DOWN
        told = {(p.default_device, p.device): p.qps for p in second.registers[0].paths.paths}
        assert told == {("mlx5_0", "mlx5_1"): 2, ("mlx5_0", "mlx5_0"): 1}


def test_peers_nics_reach_their_own_listeners_and_a_reconnect_says_them_again(path, daemons):
    gid = "::ffff:198.18.0.9"
    down = common_pb2.NicEvent(host="t9", device="mlx5_0", state=DOWN, reason="operator_fail", gid=gid)
    first = daemons(peers=(down,), mlx5_0=UP)
    with Agent.connect(str(path)) as agent:
        mine, theirs = [], []
        agent.add_listener(mine.append)
        agent.add_listener(theirs.append, peers=True)
        assert wait_until(lambda: len(theirs) == 1 and len(mine) == 1)
        assert (theirs[0].host, theirs[0].device, theirs[0].reason) == ("t9", "mlx5_0", "operator_fail")
        assert agent.peer_nic(gid) == theirs[0]
        assert agent.nic_state("mlx5_0") is NicState.UP  # the peer's mlx5_0 is not ours
        assert mine[0].device == "mlx5_0" and mine[0].state is NicState.UP
        first.stop()
        daemons(mlx5_0=UP)  # the peer's NIC came back while the agent was away: the new stream says none
        assert wait_until(lambda: agent.reconnects == 1, timeout=10)
        assert wait_until(lambda: len(mine) == 2)
        assert agent.peer_nic(gid) is None
        assert len(theirs) == 1


def test_reports_made_while_shiftd_is_away_reach_the_next_one_in_order(path, daemons):
    first = daemons(mlx5_0=UP)
    with Agent.connect(str(path)) as agent:
        agent.report(switch())
        assert wait_until(lambda: len(first.reports) == 1)
        first.stop()
        assert wait_until(lambda: not agent.registered)
        agent.report(switch(SwitchKind.FAILBACK))
        agent.report(switch())
        assert len(agent.reports) == 2  # kept: nobody has acknowledged them
        second = daemons(mlx5_0=UP)
        assert wait_until(lambda: len(second.reports) == 2, timeout=10)
        assert agent.reports.wait_empty(5)
    fb, fo = common_pb2.FAILOVER_KIND_FAILBACK, common_pb2.FAILOVER_KIND_FAILOVER
    assert kinds(first.reports) == [(1, fo)] and kinds(second.reports) == [(2, fb), (3, fo)]
    assert {r.instance for r in first.reports + second.reports} == {agent.instance}
    assert [r.agent_id for r in second.reports] == ["a1", "a1"]  # the new daemon's registration


def test_a_report_whose_answer_was_lost_goes_again_under_its_id(path, daemons):
    daemon = daemons(mlx5_0=UP)
    daemon.lose_answers = 2
    with Agent.connect(str(path)) as agent:
        agent.report(switch())
        agent.report(switch(SwitchKind.FAILBACK))
        assert agent.reports.wait_empty(5)
    # report 1 went three times (with report 2 as soon as it was queued); shiftd counts each seq once
    # (test_agents.py)
    assert [call.seq for call in daemon.calls[:3]] == [1, 1, 1]
    assert sorted({r.seq for r in daemon.reports}) == [1, 2]
    assert agent.reports.dropped == 0


def test_a_storm_of_reports_goes_in_a_few_calls_in_order(path, daemons):
    """1,000 QPs failing over at once make 1,000 reports: REPORTS_PER_CALL a call, not a call each."""
    first = daemons(mlx5_0=UP)
    with Agent.connect(str(path)) as agent:
        first.stop()  # the storm queues up meanwhile, so that the batches are known
        assert wait_until(lambda: not agent.registered)
        for _ in range(REPORTS_PER_CALL + 44):
            agent.report(switch())
        second = daemons(mlx5_0=UP)
        assert agent.reports.wait_empty(10)
    assert [len(call.more) + 1 for call in second.calls] == [REPORTS_PER_CALL, 44]
    assert [r.seq for r in second.reports] == list(range(1, REPORTS_PER_CALL + 45))
    assert [call.HasField("paths") for call in second.calls] == [False, True]  # with the last of the burst


def test_an_agent_whose_shiftd_does_not_answer_yet_catches_up(path, daemons):
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))  # a socket file nobody listens on: a daemon that died, not yet back
    stale.close()
    agent = Agent.connect(str(path))
    try:
        assert agent is not None and not agent.registered
        primary = Endpoint("::ffff:127.0.0.1", 7, 0, "mlx5_0", "tcp")
        agent.publish_qp(primary, Endpoint("::ffff:127.0.0.2", 8, 0, "mlx5_1", "tcp"))  # kept for later
        with pytest.raises(AgentError, match="not registered"):
            agent.lookup_qp("::ffff:127.0.0.9", 1)  # no waiting on a daemon that is not there
        agent.report(switch())
        daemon = daemons(mlx5_0=UP)
        assert wait_until(lambda: agent.registered and daemon.reports, timeout=10)
        assert [m.primary.qpn for p in daemon.published for m in p.qps] == [7]
        assert wait_until(lambda: agent.nic_state("mlx5_0") is NicState.UP)  # its stream runs
        assert agent.reconnects == 0  # its first registration, not a re-registration
    finally:
        agent.close()


def test_the_count_of_dropped_reports_goes_with_every_register_and_report(path, daemons):
    first = daemons(mlx5_0=UP)
    with Agent.connect(str(path)) as agent:
        agent.reports.dropped = 7  # as the queue counts those it dropped past its bound (test_reportqueue.py)
        first.stop()
        assert wait_until(lambda: not agent.registered)
        agent.report(switch())
        second = daemons(mlx5_0=UP)
        assert wait_until(lambda: len(second.reports) == 1, timeout=10)
    # the first daemon had the registration before the count was set (and may have had the agent's
    # reconnect to it while it stopped, which carries the count too)
    assert [(r.instance, r.reports_dropped) for r in first.registers[:1]] == [(agent.instance, 0)]
    assert all(r.reports_dropped == 7 for r in first.registers[1:]), first.registers
    assert [(r.instance, r.reports_dropped) for r in second.registers] == [(agent.instance, 7)]
    assert second.reports[0].reports_dropped == 7
