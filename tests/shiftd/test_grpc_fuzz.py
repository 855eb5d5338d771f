"""Every gRPC method of shiftd against random, malformed and oversized requests (hypothesis).

The daemon runs in a namespace of its own with a veth NIC, so that a fuzzed FailNic breaks nothing
real, and with its etcd beside it. Each answer must be a proper status code (never UNKNOWN or
INTERNAL), the daemon must keep serving, and what it stored in etcd must still parse.
"""

import base64
import json
import os
import subprocess

import grpc
import pytest
from daemon_harness import DaemonProcess
from google.protobuf import json_format, message_factory
from google.protobuf.descriptor import FieldDescriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from libshift.api.shift.v1 import admin_pb2, agent_pb2, common_pb2
from shiftlab.etcdproc import EtcdProcess

pytestmark = [pytest.mark.lab, pytest.mark.timeout(300)]

SERVICES = [agent_pb2.DESCRIPTOR.services_by_name["Agent"], admin_pb2.DESCRIPTOR.services_by_name["Admin"]]
METHODS = [(service, method) for service in SERVICES for method in service.methods]
PROPER = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.UNAVAILABLE,  # etcd not answering a lookup in time
    grpc.StatusCode.DEADLINE_EXCEEDED,  # a stream that stays open, or a lookup that waits
}
STORED_TYPES = {"qp": common_pb2.QpMapping, "mr": common_pb2.MrMapping, "nics": common_pb2.Nic}

SCALARS = {
    FieldDescriptor.TYPE_STRING: st.one_of(
        st.text(max_size=40),
        st.sampled_from(["mlx5_0", "fz0", "::ffff:198.18.0.1", "::1", "", "a" * 300]),
    ),
    FieldDescriptor.TYPE_UINT32: st.integers(0, 2**32 - 1),
    FieldDescriptor.TYPE_INT64: st.integers(-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: st.integers(0, 2**64 - 1),
    FieldDescriptor.TYPE_DOUBLE: st.floats(allow_nan=True, allow_infinity=True),
    FieldDescriptor.TYPE_BOOL: st.booleans(),
    FieldDescriptor.TYPE_ENUM: st.integers(-3, 8),
}


def message_of(descriptor, depth=0):
    """A strategy for random (but well-formed) messages of `descriptor`."""
    fields = {}
    for field in descriptor.fields:
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            if field.message_type.GetOptions().map_entry:
                value = st.dictionaries(st.text(max_size=10), st.text(max_size=20), max_size=20)
            elif depth > 2:
                continue
            else:
                value = message_of(field.message_type, depth + 1)
        else:
            value = SCALARS[field.type]
        if field.is_repeated and not (
            field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.GetOptions().map_entry
        ):
            value = st.lists(value, max_size=4)
        fields[field.name] = st.one_of(st.none(), value)
    cls = message_factory.GetMessageClass(descriptor)

    def build(values):
        message = cls()
        for name, value in values.items():
            if value is None:
                continue
            field = descriptor.fields_by_name[name]
            if field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.GetOptions().map_entry:
                getattr(message, name).update(value)
            elif field.is_repeated:
                target = getattr(message, name)
                if field.type == FieldDescriptor.TYPE_MESSAGE:
                    for item in value:
                        target.add().CopyFrom(item)
                else:
                    target.extend(value)
            elif field.type == FieldDescriptor.TYPE_MESSAGE:
                getattr(message, name).CopyFrom(value)
            else:
                setattr(message, name, value)
        return message

    return st.fixed_dictionaries(fields).map(build)


REQUESTS = st.sampled_from(METHODS).flatmap(
    lambda sm: st.tuples(
        st.just(sm),
        st.one_of(
            message_of(sm[1].input_type).map(lambda m: m.SerializeToString()),
            st.binary(max_size=300),  # not a protobuf message at all, or a truncated one
            st.just(b"\x0a" + b"\xff" * 9),  # a length that runs off the end
            st.just(b"\x0a\x80\x80\x80\x01" + b"x" * 64),  # a field that claims 2 MiB
        ),
        st.booleans(),  # use the registered agent's id where the request has one
    )
)


@pytest.fixture(scope="module")
def fuzz_daemon(tmp_path_factory):
    ns = f"fz{os.getpid() % 100000}"
    workdir = tmp_path_factory.mktemp("fuzz")
    subprocess.run(["ip", "netns", "add", ns], check=True)
    etcd = None
    daemon = None
    try:
        setup = [
            ["link", "set", "lo", "up"],
            ["link", "add", "fz0", "type", "veth", "peer", "name", "fz1"],
            ["link", "set", "fz0", "up"],
            ["link", "set", "fz1", "up"],
        ]
        for cmd in setup:
            subprocess.run(["ip", "-n", ns, *cmd], check=True)
        etcd = EtcdProcess(workdir / "etcd", netns=ns, log_path=workdir / "etcd.log")
        etcd.start()
        daemon = DaemonProcess(
            workdir / "d",
            netns=ns,
            sections={
                "devices": {"mlx5_0": "fz0"},
                "etcd": {"endpoints": [etcd.endpoint]},
                "server": {"max_message_bytes": 65536},
                "metrics": {"listen": ""},
            },
        )
        daemon.start()
        yield daemon, etcd
    finally:
        if daemon is not None:
            daemon.stop()
        if etcd is not None:
            etcd.kill()
        subprocess.run(["ip", "netns", "del", ns], check=False)


def stored(etcd):
    kvs = json.loads(etcd.etcdctl("get", "--prefix", "/shift/v1/", "-w", "json")).get("kvs", [])
    return {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv["value"]).decode() for kv in kvs}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=REQUESTS)
def test_every_method_answers_random_input_properly(fuzz_daemon, case):
    daemon, _ = fuzz_daemon
    (service, method), payload, use_real_id = case
    with daemon.channel() as channel:
        agent_id = daemon.agent(channel).Register(agent_pb2.RegisterRequest(name="fuzz"), timeout=10).agent_id
        if use_real_id and "agent_id" in method.input_type.fields_by_name:
            request = message_factory.GetMessageClass(method.input_type)()
            try:
                request.MergeFromString(payload)
                request.agent_id = agent_id
                payload = request.SerializeToString()
            except Exception:
                pass  # not parseable: send the raw bytes as they are
        path = f"/{service.full_name}/{method.name}"
        if method.server_streaming:
            call = channel.unary_stream(path)(payload, timeout=0.5)
            try:
                for _ in call:
                    pass
                code = grpc.StatusCode.OK
            except grpc.RpcError as exc:
                code = exc.code()
        else:
            try:
                channel.unary_unary(path)(payload, timeout=3)
                code = grpc.StatusCode.OK
            except grpc.RpcError as exc:
                code = exc.code()
        assert code in PROPER, f"{path}: {code}"
        daemon.admin(channel).RecoverNic(admin_pb2.RecoverNicRequest(device="mlx5_0"), timeout=10)


def test_daemon_still_serves_and_stored_state_parses(fuzz_daemon):
    daemon, etcd = fuzz_daemon
    with daemon.channel() as channel:
        status = daemon.admin(channel).Status(admin_pb2.StatusRequest(), timeout=10)
    assert status.host == "t0"
    assert daemon.proc.poll() is None
    for key, value in stored(etcd).items():
        kind = key.split("/")[3]
        if kind in STORED_TYPES:
            json_format.Parse(value, STORED_TYPES[kind]())  # raises if corrupted
        else:
            assert json.loads(value)["host"] == "t0"
