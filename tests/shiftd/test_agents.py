"""AgentTable: who may publish what, and what vanishes when an agent leaves."""

import json

import pytest

from libshift.api.shift.v1 import common_pb2
from shiftd.agents import AgentTable, RefusedRequest, qp_key
from shiftd.peercred import PeerCred


class DictStore:
    """The registry's desired-state interface, kept in a dict for these table tests."""

    def __init__(self):
        self.keys = {}

    def put(self, key, value):
        self.keys[key] = value

    def delete(self, key):
        self.keys.pop(key, None)


ALICE = PeerCred(pid=100, uid=1000, gid=1000)
BOB = PeerCred(pid=200, uid=1001, gid=1001)


def mapping(qpn, gid="::ffff:198.18.0.10", backup_gid="::ffff:198.18.1.10"):
    return common_pb2.QpMapping(
        primary=common_pb2.Endpoint(gid=gid, qpn=qpn, psn=1, device="mlx5_0"),
        backup=common_pb2.Endpoint(
            gid=backup_gid, qpn=qpn + 1, psn=2, device="mlx5_1", provider_data={"port": "9"}
        ),
    )


@pytest.fixture
def table():
    changes = []
    store = DictStore()
    return (
        AgentTable(store, lambda info, registered: changes.append((info.agent_id, registered))),
        store,
        changes,
    )


def test_publish_stores_json_under_canonical_key(table):
    agents, store, changes = table
    info = agents.register("conn-a", ALICE, 100, "train", "job1")
    agents.publish(info.agent_id, ALICE, [mapping(7, gid="0:0:0:0:0:ffff:c612:a")], [])
    key = "qp/::ffff:198.18.0.10/7"
    assert list(store.keys) == [key]
    assert json.loads(store.keys[key])["backup"]["qpn"] == 8
    assert qp_key("::ffff:c612:a", 7) == key
    assert changes == [(info.agent_id, True)]


def test_connection_close_withdraws_everything(table):
    agents, store, changes = table
    info = agents.register("conn-a", ALICE, 0, "", "")
    agents.publish(info.agent_id, ALICE, [mapping(1), mapping(2)], [])
    other = agents.register("conn-b", BOB, 0, "", "")
    agents.publish(other.agent_id, BOB, [mapping(3)], [])
    agents.connection_closed("conn-a")
    assert list(store.keys) == ["qp/::ffff:198.18.0.10/3"]
    assert info.agent_id not in agents.agents
    assert changes[-1] == (info.agent_id, False)


def test_agent_cannot_take_over_or_withdraw_anothers_keys(table):
    agents, store, _ = table
    a = agents.register("conn-a", ALICE, 0, "", "")
    b = agents.register("conn-b", BOB, 0, "", "")
    agents.publish(a.agent_id, ALICE, [mapping(1)], [])
    with pytest.raises(RefusedRequest) as info:
        agents.publish(b.agent_id, BOB, [mapping(1)], [])
    assert info.value.code == "PERMISSION_DENIED"
    with pytest.raises(RefusedRequest) as info:
        agents.withdraw(b.agent_id, BOB, [mapping(1).primary], [])
    assert info.value.code == "NOT_FOUND"
    with pytest.raises(RefusedRequest) as info:
        agents.publish(a.agent_id, BOB, [mapping(2)], [])
    assert info.value.code == "PERMISSION_DENIED"
    assert len(store.keys) == 1


@pytest.mark.parametrize(
    "bad",
    [
        mapping(1, gid="not-a-gid"),
        mapping(1 << 24),
        common_pb2.QpMapping(
            primary=common_pb2.Endpoint(gid="::1", qpn=1), backup=common_pb2.Endpoint(gid="x")
        ),
    ],
)
def test_malformed_mapping_is_invalid_argument(table, bad):
    agents, store, _ = table
    info = agents.register("c", ALICE, 0, "", "")
    with pytest.raises(RefusedRequest) as err:
        agents.publish(info.agent_id, ALICE, [bad], [])
    assert err.value.code == "INVALID_ARGUMENT"
    assert store.keys == {}


def test_register_with_someone_elses_pid_is_refused(table):
    agents, _, _ = table
    with pytest.raises(RefusedRequest) as err:
        agents.register("c", ALICE, 4242, "", "")
    assert err.value.code == "PERMISSION_DENIED"


def switch(kind, left, to, qps=1, default="mlx5_0"):
    return common_pb2.FailoverReport(
        kind=kind, device=left, backup_device=to, default_device=default, qps=qps
    )


FAILOVER, FAILBACK = common_pb2.FAILOVER_KIND_FAILOVER, common_pb2.FAILOVER_KIND_FAILBACK


def test_qps_on_backup_follow_failovers_and_failbacks_by_default_device(table):
    agents, _, _ = table
    a = agents.register("conn-a", ALICE, 100, "train", "job1").agent_id
    b = agents.register("conn-b", BOB, 200, "train", "job1").agent_id
    agents.record_switch(a, ALICE, switch(FAILOVER, "mlx5_0", "mlx5_1", qps=3))
    agents.record_switch(b, BOB, switch(FAILOVER, "mlx5_0", "mlx5_1"))
    agents.record_switch(b, BOB, switch(FAILOVER, "mlx5_1", "mlx5_2"))  # backup to backup: still off mlx5_0
    assert (agents.qps_on_backup("mlx5_0"), agents.qps_on_backup("mlx5_1")) == (4, 0)
    agents.record_switch(a, ALICE, switch(FAILBACK, "mlx5_1", "mlx5_0", qps=2))
    assert agents.qps_on_backup("mlx5_0") == 2
    assert {i.agent_id: i.qps_on_backup for i in agents.infos()} == {a: 1, b: 1}
    agents.record_switch(a, ALICE, switch(FAILBACK, "mlx5_1", "mlx5_0", qps=5))  # more than it had: none left
    agents.connection_closed("conn-b")  # its QPs are gone with it
    assert agents.qps_on_backup("mlx5_0") == 0


def test_an_agent_reports_only_for_itself(table):
    agents, _, _ = table
    a = agents.register("conn-a", ALICE, 100, "train", "job1").agent_id
    with pytest.raises(RefusedRequest) as refused:
        agents.record_switch(a, BOB, switch(FAILOVER, "mlx5_0", "mlx5_1"))
    assert refused.value.code == "PERMISSION_DENIED"
    with pytest.raises(RefusedRequest) as unknown:
        agents.record_switch("nobody", ALICE, switch(FAILOVER, "mlx5_0", "mlx5_1"))
    assert unknown.value.code == "NOT_FOUND"
    assert agents.qps_on_backup("mlx5_0") == 0


def test_the_agent_splits_its_publishes_at_the_daemons_limit():
    from libshift.agent import MAPPINGS_PER_CALL
    from shiftd.agents import MAX_MAPPINGS_PER_CALL

    assert MAPPINGS_PER_CALL == MAX_MAPPINGS_PER_CALL


def paths(*entries):
    """QpPaths from (default device, device in use, QPs) triples."""
    return common_pb2.QpPaths(
        paths=[common_pb2.QpPath(default_device=d, device=on, qps=n) for d, on, n in entries]
    )


def test_a_report_sent_again_counts_once_by_its_id(table):
    agents, _, _ = table
    a = agents.register("conn-a", ALICE, 100, "train", "job1").agent_id
    assert agents.record_switch(a, ALICE, switch(FAILOVER, "mlx5_0", "mlx5_1"), "inst", 1)
    assert not agents.record_switch(a, ALICE, switch(FAILOVER, "mlx5_0", "mlx5_1"), "inst", 1)  # a repeat
    assert agents.qps_on_backup("mlx5_0") == 1
    # the instance outlives a registration: after a reconnect, the same ids are still repeats
    agents.connection_closed("conn-a")
    again = agents.register("conn-a2", ALICE, 100, "train", "job1").agent_id
    assert not agents.record_switch(again, ALICE, switch(FAILOVER, "mlx5_0", "mlx5_1"), "inst", 1)
    assert agents.record_switch(again, ALICE, switch(FAILBACK, "mlx5_1", "mlx5_0"), "inst", 2)
    # another instance (or another process with the same instance name) has its own numbers
    assert agents.record_switch(again, ALICE, switch(FAILOVER, "mlx5_0", "mlx5_1"), "other", 1)
    b = agents.register("conn-b", BOB, 200, "train", "job1").agent_id
    assert agents.record_switch(b, BOB, switch(FAILOVER, "mlx5_0", "mlx5_1"), "inst", 1)
    # no id (seq 0): an older agent's report, always counted
    assert agents.record_switch(b, BOB, switch(FAILOVER, "mlx5_0", "mlx5_1"))
    assert agents.record_switch(b, BOB, switch(FAILOVER, "mlx5_0", "mlx5_1"))


def test_the_agents_paths_say_where_its_qps_run(table):
    agents, _, _ = table
    # a daemon that has just started hears where the agent's QPs are from its registration
    a = agents.register(
        "conn-a", ALICE, 100, "train", "job1", paths(("mlx5_0", "mlx5_1", 2), ("mlx5_0", "mlx5_0", 5))
    ).agent_id
    assert agents.qps_on_backup("mlx5_0") == 2
    # with a report, the paths are taken as they are, not derived from it (a resent report adds nothing)
    assert agents.record_switch(
        a, ALICE, switch(FAILOVER, "mlx5_0", "mlx5_1"), "i", 1, paths(("mlx5_0", "mlx5_1", 3))
    )
    assert agents.qps_on_backup("mlx5_0") == 3
    assert agents.record_switch(a, ALICE, switch(FAILBACK, "mlx5_1", "mlx5_0", qps=3), "i", 2, paths())
    assert agents.qps_on_backup("mlx5_0") == 0
    assert [i.qps_on_backup for i in agents.infos()] == [0]


def test_seen_reports_keep_the_latest_instances():
    from shiftd.reports import SeenReports

    seen = SeenReports(limit=2)
    assert seen.first_time(1, "a", 1) and seen.first_time(1, "b", 1)
    assert not seen.first_time(1, "a", 1)  # "a" used most recently now
    assert seen.first_time(1, "c", 1)  # past the limit: "b", the oldest, is forgotten
    assert seen.first_time(1, "b", 1) and not seen.first_time(1, "c", 1)
    assert seen.first_time(1, "c", 5) and not seen.first_time(1, "c", 3)  # below the highest: a repeat


def test_reports_an_agent_dropped_are_counted_once_per_instance(table):
    agents, _, _ = table
    a = agents.register("conn-a", ALICE, 100, "train", "job1").agent_id
    assert agents.count_dropped(a, ALICE, "i", 0) == 0
    assert agents.count_dropped(a, ALICE, "i", 3) == 3  # told with a report: 3 the daemon had not heard of
    assert agents.count_dropped(a, ALICE, "i", 3) == 0  # told again (the next report, a re-register)
    assert agents.count_dropped(a, ALICE, "i", 5) == 2
    assert [i.reports_dropped for i in agents.infos()] == [5]  # for shiftctl status
    assert agents.count_dropped(a, ALICE, "j", 1) == 1  # another instance of the process: its own count
    with pytest.raises(RefusedRequest):
        agents.count_dropped(a, BOB, "i", 9)  # only the agent's own process speaks for it
