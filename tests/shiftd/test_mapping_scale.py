"""10,000 published mappings: stored, looked up, and withdrawn when their agent leaves."""

import json
import random
import subprocess
import sys
import time

import grpc
import pytest
from waiting import wait_until

from libshift.api.shift.v1 import admin_pb2, agent_pb2

pytestmark = [pytest.mark.lab, pytest.mark.timeout(240)]
COUNT = 10_000

PUBLISHER = """
import sys, grpc
from libshift.api.shift.v1 import agent_pb2, agent_pb2_grpc, common_pb2
count = int(sys.argv[2])
def mapping(qpn):
    return common_pb2.QpMapping(
        primary=common_pb2.Endpoint(gid="::ffff:198.18.0.10", qpn=qpn, psn=qpn, device="mlx5_0"),
        backup=common_pb2.Endpoint(gid="::ffff:198.18.1.10", qpn=qpn + 1, psn=qpn, device="mlx5_1"))
with grpc.insecure_channel("unix:" + sys.argv[1]) as ch:
    stub = agent_pb2_grpc.AgentStub(ch)
    agent_id = stub.Register(agent_pb2.RegisterRequest(name="many"), timeout=10).agent_id
    for start in range(0, count, 1000):
        qps = [mapping(2 * q) for q in range(start, min(count, start + 1000))]
        stub.Publish(agent_pb2.PublishRequest(agent_id=agent_id, qps=qps), timeout=30)
    print("published", flush=True)
    sys.stdin.readline()
"""


def etcd_count(etcd, prefix):
    out = etcd.etcdctl("get", "--prefix", prefix, "--keys-only", "--limit", "1", "-w", "json")
    return json.loads(out).get("count", 0)


def test_ten_thousand_mappings(etcd_daemon, etcd):
    publisher = subprocess.Popen(
        [sys.executable, "-c", PUBLISHER, etcd_daemon.socket, str(COUNT)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        started = time.monotonic()
        assert publisher.stdout.readline().strip() == "published"
        assert wait_until(lambda: etcd_count(etcd, "/shift/v1/qp/") == COUNT, timeout=90)
        stored_after = time.monotonic() - started
        with etcd_daemon.channel() as channel:
            agent = etcd_daemon.agent(channel)
            agent.Register(agent_pb2.RegisterRequest(name="looker"), timeout=10)
            for qpn in random.Random(7).sample(range(COUNT), 50):
                found = agent.LookupQp(
                    agent_pb2.LookupQpRequest(gid="::ffff:198.18.0.10", qpn=2 * qpn), timeout=10
                ).mapping
                assert (found.backup.qpn, found.backup.device) == (2 * qpn + 1, "mlx5_1")
            status = etcd_daemon.admin(channel).Status(admin_pb2.StatusRequest(), timeout=10)
            assert status.pending_writes == 0
            assert [a.qp_mappings for a in status.agents if a.name == "many"] == [COUNT]
            with pytest.raises(grpc.RpcError) as info:
                agent.LookupQp(agent_pb2.LookupQpRequest(gid="::ffff:198.18.0.10", qpn=1), timeout=10)
            assert info.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        publisher.kill()
        publisher.wait()
    assert wait_until(lambda: etcd_count(etcd, "/shift/v1/qp/") == 0, timeout=90)
    assert etcd_count(etcd, "/shift/v1/nics/") == 1
    print(f"{COUNT} mappings in etcd after {stored_after:.1f} s")
