"""shiftd as a process: who may call what, bad input, etcd outages, agents leaving, clean stop.

These run a real daemon in the root namespace with one tcp device on `lo` (never failed here:
fault injection is tested on the lab fabric) and, where needed, a real etcd on loopback.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import pytest
from daemon_harness import DaemonProcess
from waiting import wait_until

from libshift.api.shift.v1 import admin_pb2, agent_pb2, common_pb2
from shiftlab.etcdproc import EtcdProcess

pytestmark = [pytest.mark.lab, pytest.mark.timeout(120)]


def mapping(qpn):
    return common_pb2.QpMapping(
        primary=common_pb2.Endpoint(gid="::ffff:127.0.0.1", qpn=qpn, psn=1, device="mlx5_0"),
        backup=common_pb2.Endpoint(gid="::ffff:127.0.0.2", qpn=qpn + 100, psn=7, device="mlx5_1"),
    )


def etcd_keys(member: EtcdProcess, prefix="/shift/v1/") -> dict[str, str]:
    out = member.etcdctl("get", "--prefix", prefix, "-w", "json")
    kvs = json.loads(out).get("kvs", [])
    import base64

    return {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv["value"]).decode() for kv in kvs}


@pytest.fixture
def world_dir():
    """A directory that an unprivileged user can enter (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="shift-daemon-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def daemon(tmp_path):
    d = DaemonProcess(tmp_path / "d", sections={"devices": {"mlx5_0": "lo"}})
    d.start()
    yield d
    d.stop()


@pytest.fixture
def daemon_with_etcd(etcd_daemon, etcd):
    return etcd_daemon, etcd


# A child that loads everything as root, then drops to nobody and calls shiftd twice: an admin
# call (shiftctl status) and an agent call (Register).
AS_NOBODY = """
import os, sys, grpc
from shiftd import ctl
from libshift.api.shift.v1 import agent_pb2, agent_pb2_grpc
socket = sys.argv[1]
assert ctl.main(["--socket", socket, "nics"]) == 0          # warm up as root
os.setgroups([]); os.setgid(65534); os.setuid(65534)
print("ctl", ctl.main(["--socket", socket, "status"]), flush=True)
with grpc.insecure_channel("unix:" + socket, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
    reply = agent_pb2_grpc.AgentStub(ch).Register(agent_pb2.RegisterRequest(name="nobody"), timeout=10)
    print("agent", reply.agent_id.split("-")[0] == str(os.getpid()), flush=True)
"""


def test_non_admin_caller_is_denied_admin_calls_but_may_register(world_dir):
    d = DaemonProcess(
        world_dir / "d", sections={"devices": {"mlx5_0": "lo"}, "server": {"socket_mode": "0666"}}
    )
    os.chmod(d.workdir, 0o755)
    d.start()
    try:
        result = subprocess.run(
            [sys.executable, "-c", AS_NOBODY, d.socket], capture_output=True, text=True, timeout=60
        )
        with d.channel() as channel:  # still serving
            status = d.admin(channel).Status(admin_pb2.StatusRequest(), timeout=10)
    finally:
        d.stop()
    assert result.returncode == 0, result.stderr
    assert "ctl 1" in result.stdout
    assert "agent True" in result.stdout
    denied = [line for line in result.stderr.splitlines() if "permission denied" in line]
    assert denied == [
        "shiftctl: permission denied: admin calls need root or membership of group 'shift-admin'"
    ]
    assert status.host == "t0"


def test_socket_mode_and_private_grpc_socket(daemon):
    assert os.stat(daemon.socket).st_mode & 0o777 == 0o660
    private = list(Path(daemon.socket).parent.glob(".shiftd-grpc-*"))
    assert len(private) == 1
    assert os.stat(private[0]).st_mode & 0o777 == 0o700


def test_serves_without_etcd_and_reports_it(daemon):
    with daemon.channel() as channel:
        status = daemon.admin(channel).Status(admin_pb2.StatusRequest(), timeout=10)
    assert not status.etcd_connected
    assert status.pending_writes >= 2  # host record and NIC state wait for etcd
    assert [n.device for n in status.nics] == ["mlx5_0"]
    assert status.nics[0].state == common_pb2.NIC_STATE_UP


def test_bad_requests_get_status_codes_and_daemon_keeps_serving(daemon):
    with daemon.channel() as channel:
        agent = daemon.agent(channel)
        admin = daemon.admin(channel)
        agent_id = agent.Register(agent_pb2.RegisterRequest(name="t"), timeout=10).agent_id

        def code_of(call, request):
            with pytest.raises(grpc.RpcError) as info:
                call(request, timeout=10)
            return info.value.code()

        assert code_of(admin.FailNic, admin_pb2.FailNicRequest(device="mlx5_9")) == grpc.StatusCode.NOT_FOUND
        assert code_of(admin.RecoverNic, admin_pb2.RecoverNicRequest(device="")) == grpc.StatusCode.NOT_FOUND
        assert code_of(admin.FailNic, admin_pb2.FailNicRequest(device="mlx5_0", mode=77)) == (
            grpc.StatusCode.INVALID_ARGUMENT
        )
        # a gray fault without its parameter, or out of range, or a parameter of another mode: refused
        # before anything is touched (this daemon's NIC is the host's lo)
        lossy, slow = common_pb2.FAULT_MODE_LOSSY, common_pb2.FAULT_MODE_SLOW
        for bad, message in [
            (admin_pb2.FailNicRequest(mode=lossy), "loss must be greater than 0% and less than 100%"),
            (admin_pb2.FailNicRequest(mode=lossy, loss_percent=float("nan")), "not nan%"),
            (admin_pb2.FailNicRequest(mode=slow, rate_bits_per_second=10), "rate must be from 1kbit"),
            (admin_pb2.FailNicRequest(loss_percent=5), "a loss is for mode lossy only, not down"),
            (admin_pb2.FailNicRequest(flap_period_seconds=-1), "a flap period is for mode flap only"),
        ]:
            bad.device = "mlx5_0"
            with pytest.raises(grpc.RpcError) as refused:
                admin.FailNic(bad, timeout=10)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert message in refused.value.details()
        assert admin.ListNics(admin_pb2.ListNicsRequest(), timeout=10).nics[0].fault == 0
        huge = agent_pb2.PublishRequest(agent_id=agent_id, qps=[mapping(i) for i in range(20000)])
        assert huge.ByteSize() > (1 << 20)
        assert code_of(agent.Publish, huge) == grpc.StatusCode.RESOURCE_EXHAUSTED
        bad_gid = agent_pb2.PublishRequest(agent_id=agent_id, qps=[mapping(1)])
        bad_gid.qps[0].primary.gid = "not-a-gid"
        assert code_of(agent.Publish, bad_gid) == grpc.StatusCode.INVALID_ARGUMENT
        assert (
            code_of(agent.Publish, agent_pb2.PublishRequest(agent_id="nobody-here"))
            == grpc.StatusCode.NOT_FOUND
        )
        lookup = agent_pb2.LookupQpRequest(gid="::ffff:1.2.3.4", qpn=1, wait_seconds=-1)
        assert code_of(agent.LookupQp, lookup) == grpc.StatusCode.INVALID_ARGUMENT
        # raw garbage where a protobuf message should be
        garbage = channel.unary_unary("/shift.v1.Admin/ListNics")
        with pytest.raises(grpc.RpcError) as info:
            garbage(b"\xff\xff\xff\xff\x0f", timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details() == "malformed ListNicsRequest"
        assert [n.device for n in admin.ListNics(admin_pb2.ListNicsRequest(), timeout=10).nics] == ["mlx5_0"]


def test_shiftctl_errors_are_one_line(daemon, tmp_path):
    def ctl(*args):
        return subprocess.run(
            [sys.executable, "-m", "shiftd.ctl", *args], capture_output=True, text=True, timeout=60
        )

    unknown = ctl("--socket", daemon.socket, "fail-nic", "mlx5_9")
    assert unknown.returncode == 1
    assert unknown.stderr.strip() == "shiftctl: unknown device 'mlx5_9' (known: mlx5_0)"
    missing = ctl("--socket", str(tmp_path / "none.sock"), "nics")
    assert missing.returncode == 1
    assert missing.stderr.count("\n") == 1 and "no shiftd socket at" in missing.stderr
    ok = ctl("--socket", daemon.socket, "nics", "--json")
    assert ok.returncode == 0
    assert json.loads(ok.stdout)[0]["device"] == "mlx5_0"
    usage = ctl("--socket", daemon.socket, "fail-nic", "mlx5_0", "--mode", "melt")
    assert usage.returncode == 2 and "invalid choice" in usage.stderr


def test_publish_lookup_and_lapse_when_agent_leaves(daemon_with_etcd):
    d, etcd = daemon_with_etcd
    publisher = subprocess.Popen(
        [sys.executable, "-c", PUBLISHER, d.socket], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert publisher.stdout.readline().strip() == "published"
        key = "/shift/v1/qp/::ffff:127.0.0.1/42"
        assert wait_until(lambda: key in etcd_keys(etcd))
        with d.channel() as channel:
            agent = d.agent(channel)
            agent.Register(agent_pb2.RegisterRequest(name="looker"), timeout=10)
            found = agent.LookupQp(agent_pb2.LookupQpRequest(gid="::ffff:127.0.0.1", qpn=42), timeout=10)
            assert found.mapping.backup.qpn == 142
            assert found.mapping.backup.provider_data["port"] == "4791"
            with pytest.raises(grpc.RpcError) as info:
                agent.LookupQp(agent_pb2.LookupQpRequest(gid="::ffff:127.0.0.1", qpn=43), timeout=10)
            assert info.value.code() == grpc.StatusCode.NOT_FOUND
            publisher.stdin.write("43\n")
            publisher.stdin.flush()
            waited = agent.LookupQp(
                agent_pb2.LookupQpRequest(gid="::ffff:127.0.0.1", qpn=43, wait_seconds=10), timeout=20
            )
            assert waited.mapping.backup.qpn == 143
    finally:
        publisher.kill()
        publisher.wait()
    # the publisher died: its registration lapses and its mappings leave etcd
    assert wait_until(lambda: not any("/qp/" in k for k in etcd_keys(etcd)))
    with d.channel() as channel:
        status = d.admin(channel).Status(admin_pb2.StatusRequest(), timeout=10)
    assert [a.name for a in status.agents] == ["looker"] or status.agents == []


PUBLISHER = """
import sys, grpc
from libshift.api.shift.v1 import agent_pb2, agent_pb2_grpc, common_pb2
def mapping(qpn):
    return common_pb2.QpMapping(
        primary=common_pb2.Endpoint(gid="::ffff:127.0.0.1", qpn=qpn, psn=1, device="mlx5_0"),
        backup=common_pb2.Endpoint(gid="::ffff:127.0.0.2", qpn=qpn + 100, psn=7, device="mlx5_1",
                                   provider_data={"port": "4791"}))
with grpc.insecure_channel("unix:" + sys.argv[1]) as ch:
    stub = agent_pb2_grpc.AgentStub(ch)
    agent_id = stub.Register(agent_pb2.RegisterRequest(name="publisher"), timeout=10).agent_id
    stub.Publish(agent_pb2.PublishRequest(agent_id=agent_id, qps=[mapping(42)]), timeout=10)
    print("published", flush=True)
    for line in sys.stdin:
        stub.Publish(agent_pb2.PublishRequest(agent_id=agent_id, qps=[mapping(int(line))]), timeout=10)
"""


def test_sigterm_revokes_lease_and_removes_socket(daemon_with_etcd):
    d, etcd = daemon_with_etcd
    assert wait_until(lambda: "/shift/v1/hosts/t0" in etcd_keys(etcd))
    assert "/shift/v1/nics/t0/mlx5_0" in etcd_keys(etcd)
    started = time.monotonic()
    assert d.stop(signal.SIGTERM) == 0
    # revoked, not expired: gone at once rather than after the 3 s lease
    assert etcd_keys(etcd) == {}
    assert time.monotonic() - started < 3
    assert not os.path.exists(d.socket)
    assert not list(Path(d.socket).parent.glob(".shiftd-grpc-*"))
    assert "stopped" in d.log()


def test_second_daemon_on_same_socket_refuses(daemon, tmp_path):
    other = DaemonProcess(tmp_path / "other", sections={"server": {"socket": daemon.socket}})
    result = subprocess.run(
        [sys.executable, "-m", "shiftd.daemon", "--config", str(other.config_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert (
        result.stderr.strip().splitlines()[-1]
        == f"shiftd: another shiftd is already serving on {daemon.socket}"
    )
    with daemon.channel() as channel:  # the first one is untouched
        assert daemon.admin(channel).ListNics(admin_pb2.ListNicsRequest(), timeout=10).nics
