"""Publish rate limits: the bucket arithmetic, and a real daemon refusing a flood from one connection."""

import grpc
import pytest
from daemon_harness import DaemonProcess

from libshift.api.shift.v1 import agent_pb2, common_pb2
from shiftd.ratelimit import RateLimiter


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_bucket_refills_at_rate_up_to_burst():
    clock = Clock()
    limiter = RateLimiter(rate=10, burst=20, clock=clock)
    assert limiter.take("a", 20)
    assert not limiter.take("a", 1)
    assert limiter.take("b", 5)  # buckets are per key
    clock.now = 0.5
    assert limiter.take("a", 5)
    assert not limiter.take("a", 1)
    clock.now = 100
    assert not limiter.take("a", 21)  # never more than the burst
    assert limiter.take("a", 20)
    limiter.forget("a")
    assert limiter.take("a", 20)


@pytest.mark.lab
def test_flooding_connection_gets_resource_exhausted_others_do_not(tmp_path):
    daemon = DaemonProcess(tmp_path / "d", sections={"server": {"publish_rate": 1.0, "publish_burst": 50}})
    daemon.start()
    try:

        def publish(channel, count, base):
            agent = daemon.agent(channel)
            agent_id = agent.Register(agent_pb2.RegisterRequest(name="flood"), timeout=10).agent_id
            qps = [
                common_pb2.QpMapping(
                    primary=common_pb2.Endpoint(gid="::ffff:10.0.0.1", qpn=base + i),
                    backup=common_pb2.Endpoint(gid="::ffff:10.0.0.2", qpn=base + i),
                )
                for i in range(count)
            ]
            agent.Publish(agent_pb2.PublishRequest(agent_id=agent_id, qps=qps), timeout=10)

        with daemon.channel() as flooder:
            publish(flooder, 50, 0)
            with pytest.raises(grpc.RpcError) as info:
                publish(flooder, 10, 100)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "publish rate limit" in info.value.details()
        # a new connection has a bucket of its own (a local subchannel pool: gRPC would otherwise share
        # one connection between channels of a process)
        options = [("grpc.use_local_subchannel_pool", 1)]
        with grpc.insecure_channel(f"unix:{daemon.socket}", options=options) as polite:
            publish(polite, 10, 200)
    finally:
        daemon.stop()
