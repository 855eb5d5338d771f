"""etcd over TLS with client certificates, and etcd auth: shiftd against a real etcd that demands both.

Certificates are made here with the `openssl` CLI: a CA, a server certificate for 127.0.0.1, and
two client certificates. etcd (3.4) takes a client certificate's CN as the user name when a
request carries no valid token, so the daemon's certificate here names no etcd user ("node-t0"):
whatever it may do, it may do only through its token. The `shiftd` certificate names the user,
for the one case that relies on exactly that (certificate-only auth).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import subprocess
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from daemon_harness import DaemonProcess
from waiting import wait_until

from libshift.api.shift.v1 import agent_pb2, common_pb2
from shiftd.registry import Registry, RegistryUnavailable
from shiftd.registry_auth import EtcdSecurity
from shiftlab.etcdproc import EtcdError, EtcdProcess, EtcdTLS, free_port

pytestmark = pytest.mark.timeout(60)
ROOT_PASSWORD = "root-secret"
PASSWORD = "shiftd-secret"
TOKEN_TTL = 1  # etcd --auth-token-ttl: an unused token expires after 1-2 s


@dataclass(frozen=True)
class Pki:
    """The files of a test PKI; `other_ca` signed nothing etcd uses."""

    ca: Path
    server: tuple[Path, Path]  # (certificate, key)
    node: tuple[Path, Path]  # the daemon's client certificate, CN=node-t0 (no etcd user)
    shiftd: tuple[Path, Path]  # a client certificate whose CN is the etcd user "shiftd"
    other_ca: Path


def openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=30)


def issue(directory: Path, name: str, cn: str, ca: Path, extensions: str) -> tuple[Path, Path]:
    """A P-256 key and a certificate for it, signed by `ca` (whose key is next to it)."""
    key, csr, crt = (directory / f"{name}.{ext}" for ext in ("key", "csr", "crt"))
    ext = directory / f"{name}.ext"
    ext.write_text(extensions + "\n")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", key, "-out", csr, "-subj", f"/CN={cn}")  # fmt: skip
    openssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca.with_suffix(".key"), "-CAcreateserial",
            "-days", "1", "-out", crt, "-extfile", ext)  # fmt: skip
    return crt, key


def make_ca(directory: Path, name: str) -> Path:
    crt, key = directory / f"{name}.crt", directory / f"{name}.key"
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", key, "-out", crt, "-days", "1", "-subj", f"/CN={name}")  # fmt: skip
    return crt


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca = make_ca(d, "shift-test-ca")
    client = "extendedKeyUsage=clientAuth"
    return Pki(
        ca=ca,
        # etcd dials its own gRPC gateway with its server certificate: it needs clientAuth too
        server=issue(
            d, "server", "etcd", ca, "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth"
        ),
        node=issue(d, "node", "node-t0", ca, client),
        shiftd=issue(d, "shiftd", "shiftd", ca, client),
        other_ca=make_ca(d, "other-ca"),
    )


def start_secure_etcd(directory: Path, pki: Pki, token_ttl: int | None) -> EtcdProcess:
    """etcd with TLS, client certificates required, auth on, and user `shiftd` limited to /shift/."""
    tls = EtcdTLS(pki.ca, *pki.server, client_cert_file=pki.node[0], client_key_file=pki.node[1])
    member = EtcdProcess(
        data_dir=directory / "etcd", log_path=directory / "etcd.log", tls=tls, auth_token_ttl=token_ttl
    )
    try:
        member.start()
        member.add_prefix_user("shiftd", PASSWORD, "shift", "/shift/")
        member.enable_auth(ROOT_PASSWORD)
    except BaseException:
        member.kill()
        raise
    return member


@pytest.fixture(scope="module")
def secure_etcd(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[EtcdProcess]:
    """One secure etcd for the tests that need no clean store (each writes its own keys), with
    etcd's own token TTL (5 min): no token expires during a test."""
    member = start_secure_etcd(tmp_path_factory.mktemp("etcd"), pki, None)
    yield member
    member.kill()


@pytest.fixture
def expiring_etcd(tmp_path: Path, pki: Pki) -> Iterator[EtcdProcess]:
    """A secure etcd of its own whose tokens expire after TOKEN_TTL s unused."""
    member = start_secure_etcd(tmp_path, pki, TOKEN_TTL)
    yield member
    member.kill()


@pytest.fixture
def password_file(tmp_path: Path) -> Path:
    path = tmp_path / "etcd-password"
    path.write_text(PASSWORD + "\n")
    path.chmod(0o600)
    return path


def security(pki: Pki, password_file: Path, **changes: Any) -> EtcdSecurity:
    """The daemon's settings: TLS with its node certificate, user shiftd; `changes` override."""
    base = {
        "ca_file": str(pki.ca),
        "cert_file": str(pki.node[0]),
        "key_file": str(pki.node[1]),
        "user": "shiftd",
        "password_file": str(password_file),
    }
    return EtcdSecurity(**(base | changes))


def registry(member: EtcdProcess, sec: EtcdSecurity, **kwargs: Any) -> Registry:
    options = {"lease_ttl": 3, "timeout": 2.0, "retry_initial": 0.05, "retry_max": 0.5} | kwargs
    return Registry([(member.client_host, member.client_port)], "h0", security=sec, **options)


def run(coro: Coroutine[Any, Any, Any], timeout: float = 40) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


def stored(member: EtcdProcess, key: str) -> tuple[str, int] | None:
    """(value, lease) of a key as etcd reports it to root."""
    kvs = json.loads(member.etcdctl("get", key, "-w", "json")).get("kvs")
    if not kvs:
        return None
    return base64.b64decode(kvs[0]["value"]).decode(), int(kvs[0].get("lease", 0))


def revision(member: EtcdProcess) -> int:
    return int(json.loads(member.etcdctl("get", "/", "-w", "json"))["header"]["revision"])


def auth_of(reg: Registry) -> Any:
    """The registry's token keeper (to count authentications)."""
    return reg._link.client.auth


def test_registry_publishes_reads_and_watches_over_tls_with_auth(secure_etcd, pki, password_file):
    async def scenario() -> tuple[str | None, Any, Any, dict[str, int]]:
        reg = registry(secure_etcd, security(pki, password_file))
        await reg.start()
        try:
            reg.put("hosts/published", "up")
            assert await reg.wait_synced(15), reg.errors
            held = await asyncio.to_thread(stored, secure_etcd, "/shift/v1/hosts/published")
            value = await reg.get("hosts/published")
            events = reg.watch_prefix("nics/", start_revision=revision(secure_etcd) + 1)
            await asyncio.to_thread(secure_etcd.etcdctl, "put", "/shift/v1/nics/h1/mlx5_0", "down")
            event = await asyncio.wait_for(anext(events), 15)
            return value, held, event, reg.errors
        finally:
            await reg.stop()

    value, held, event, errors = run(scenario())
    assert value == "up"
    assert held is not None and held[0] == "up" and held[1] != 0  # under the daemon's lease
    assert (event.type, event.key, event.value) == ("PUT", "nics/h1/mlx5_0", "down")
    assert "auth" not in errors
    assert stored(secure_etcd, "/shift/v1/hosts/published") is None  # revoked at stop, through TLS and auth


@pytest.mark.parametrize(
    ("case", "changes", "why"),
    [
        ("no client certificate", {"cert_file": "", "key_file": ""}, ""),
        ("plaintext", {"ca_file": "", "cert_file": "", "key_file": ""}, ""),
        ("server not trusted", {"ca_file": "other"}, ""),
        ("wrong server name", {"server_name": "etcd.example"}, "Hostname Verification"),
    ],
)
def test_clients_without_valid_tls_are_refused(secure_etcd, pki, password_file, case, changes, why):
    if changes.get("ca_file") == "other":
        changes = {"ca_file": str(pki.other_ca)}
    reg = registry(secure_etcd, security(pki, password_file, **changes), timeout=1.0)

    async def scenario() -> str:
        await reg.start()
        try:
            with pytest.raises(RegistryUnavailable) as info:
                await reg.get("hosts/h0")
            return str(info.value)
        finally:
            await reg.stop(revoke=False)

    message = run(scenario())
    assert message.startswith(f"etcd at {secure_etcd.endpoint} did not answer within 1s (unavailable:")
    assert why in message
    assert "\n" not in message
    assert "auth" not in reg.errors  # refused by TLS, before etcd's auth could look at it


def test_wrong_password_is_refused_with_one_line_and_not_retried(secure_etcd, pki, password_file, caplog):
    password_file.write_text("not-the-password\n")
    reg = registry(secure_etcd, security(pki, password_file), timeout=10.0)

    async def scenario() -> tuple[str, float, bool]:
        await reg.start()
        try:
            started = time.monotonic()
            with pytest.raises(RegistryUnavailable) as info:
                await reg.get("hosts/h0")
            elapsed = time.monotonic() - started
            reg.put("hosts/refused", "up")
            return str(info.value), elapsed, await reg.wait_synced(1.0)
        finally:
            await reg.stop(revoke=False)

    message, elapsed, synced = run(scenario())
    assert message == (
        f"etcd at {secure_etcd.endpoint}: etcd refused user 'shiftd': "
        "etcdserver: authentication failed, invalid user ID or password"
    )
    assert elapsed < 10.0  # refused at once: retrying a wrong password until the timeout helps nobody
    assert not synced
    assert reg.errors.get("auth", 0) >= 2  # the lookup and the reconciler
    warnings = [
        r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "refused" in r.getMessage()
    ]
    assert len(warnings) == 1  # shown although etcd never answered, and not once per retry
    assert stored(secure_etcd, "/shift/v1/hosts/refused") is None


def test_shiftd_user_is_limited_to_the_shift_prefix(secure_etcd, pki, password_file):
    as_shiftd = f"shiftd:{PASSWORD}"
    secure_etcd.etcdctl("put", "/shift/v1/probe", "ok", user=as_shiftd)
    assert stored(secure_etcd, "/shift/v1/probe") == ("ok", 0)
    with pytest.raises(EtcdError, match="permission denied"):
        secure_etcd.etcdctl("put", "/elsewhere/probe", "no", user=as_shiftd)
    with pytest.raises(EtcdError, match="permission denied"):
        secure_etcd.etcdctl("get", "/elsewhere/probe", user=as_shiftd)
    assert stored(secure_etcd, "/elsewhere/probe") is None

    # a registry configured with a prefix outside the role's range gets one clear refusal
    reg = registry(secure_etcd, security(pki, password_file), prefix="/elsewhere/v1")

    async def scenario() -> str:
        await reg.start()
        try:
            with pytest.raises(RegistryUnavailable) as info:
                await reg.get("hosts/h0")
            return str(info.value)
        finally:
            await reg.stop(revoke=False)

    assert run(scenario()) == f"etcd at {secure_etcd.endpoint}: etcdserver: permission denied"


def test_expired_token_is_renewed_for_writes_and_watches(expiring_etcd, pki, password_file):
    member = expiring_etcd

    async def scenario() -> tuple[list[int], Any, dict[str, int]]:
        # lease 60 s: no keep-alive during the test, so the token really goes unused
        reg = registry(member, security(pki, password_file), lease_ttl=60)
        await reg.start()
        try:
            reg.put("hosts/h0", "up")
            assert await reg.wait_synced(15), reg.errors
            counts = [auth_of(reg).authentications]
            await asyncio.sleep(TOKEN_TTL + 2)  # the token expires
            reg.put("hosts/h0", "still up")  # a unary call: refused once, renewed, retried
            assert await reg.wait_synced(15), reg.errors
            counts.append(auth_of(reg).authentications)
            assert "auth" not in reg.errors
            await asyncio.sleep(TOKEN_TTL + 2)  # expires again; now a watch is the first to notice
            events = reg.watch_prefix("nics/", start_revision=revision(member) + 1)
            await asyncio.to_thread(member.etcdctl, "put", "/shift/v1/nics/h1/mlx5_0", "up")
            event = await asyncio.wait_for(anext(events), 15)
            counts.append(auth_of(reg).authentications)
            return counts, event, reg.errors
        finally:
            await reg.stop(revoke=False)

    counts, event, errors = run(scenario())
    assert [b - a for a, b in itertools.pairwise(counts)] == [1, 1]  # one renewal per expiry
    assert (event.key, event.value) == ("nics/h1/mlx5_0", "up")
    assert errors == {"auth": 1}  # the watch etcd cancelled for the expired token
    assert stored(member, "/shift/v1/hosts/h0")[0] == "still up"


def test_several_endpoints_check_one_server_name_and_fail_over(secure_etcd, pki, password_file):
    """gRPC's list target "a:p,b:p" is no name a certificate holds: `server_name` is checked instead,
    and pick_first still moves past a dead member (first in the list) to the live one."""
    dead = ("127.0.0.1", free_port())
    live = (secure_etcd.client_host, secure_etcd.client_port)
    sec = security(pki, password_file, server_name="127.0.0.1")
    with pytest.raises(ValueError, match=r"etcd\.server_name: required with several https:// endpoints"):
        Registry([dead, live], "h0", security=security(pki, password_file))

    async def scenario() -> tuple[bool, dict[str, int]]:
        reg = Registry(
            [dead, live], "h0", lease_ttl=3, timeout=2.0, retry_initial=0.05, retry_max=0.5, security=sec
        )
        await reg.start()
        try:
            reg.put("hosts/two-endpoints", "up")
            return await reg.wait_synced(15), reg.errors
        finally:
            await reg.stop()

    synced, errors = run(scenario())
    assert synced, errors


def test_certificate_alone_can_name_the_user(secure_etcd, pki):
    """No password at all: etcd takes the user from the certificate's CN (here "shiftd")."""
    by_cert = EtcdSecurity(ca_file=str(pki.ca), cert_file=str(pki.shiftd[0]), key_file=str(pki.shiftd[1]))
    node_only = EtcdSecurity(ca_file=str(pki.ca), cert_file=str(pki.node[0]), key_file=str(pki.node[1]))

    async def publish(sec: EtcdSecurity, wait: float) -> tuple[bool, dict[str, int], Any]:
        reg = registry(secure_etcd, sec)
        await reg.start()
        try:
            reg.put("hosts/by-cert", "by certificate")
            synced = await reg.wait_synced(wait)
            return synced, reg.errors, await asyncio.to_thread(stored, secure_etcd, "/shift/v1/hosts/by-cert")
        finally:
            await reg.stop()

    synced, errors, held = run(publish(node_only, 3.0))
    assert not synced and held is None  # CN=node-t0 is no etcd user: refused
    assert errors.get("auth", 0) >= 1
    synced, errors, held = run(publish(by_cert, 15.0))
    assert synced, errors
    assert held is not None and held[0] == "by certificate"


def test_auth_without_tls_and_switched_on_while_running(etcd, password_file):
    """Plaintext with auth works too; and shiftd may be configured before `etcdctl auth enable`
    (the order of a rollout): it goes without a token until etcd asks for one."""
    etcd.add_prefix_user("shiftd", PASSWORD, "shift", "/shift/")
    sec = EtcdSecurity(user="shiftd", password_file=str(password_file))

    async def scenario() -> tuple[int, int, str | None]:
        reg = registry(etcd, sec)
        await reg.start()
        try:
            reg.put("hosts/h0", "before auth")
            assert await reg.wait_synced(15), reg.errors
            before = auth_of(reg).authentications
            await asyncio.to_thread(etcd.enable_auth, ROOT_PASSWORD)
            reg.put("hosts/h0", "with auth")
            assert await reg.wait_synced(15), reg.errors
            return before, auth_of(reg).authentications, await reg.get("hosts/h0")
        finally:
            await reg.stop()

    before, after, value = run(scenario())
    assert (before, after) == (0, 1)  # no token while auth was off, one since
    assert value == "with auth"
    with pytest.raises(EtcdError, match="user name is empty"):
        etcd.etcdctl("get", "/shift/v1/hosts/h0", user="")  # auth is really on


def test_daemon_publishes_over_tls_with_auth_after_its_token_expired(
    tmp_path, expiring_etcd, pki, password_file
):
    daemon = DaemonProcess(
        tmp_path / "d",
        sections={
            "devices": {"mlx5_0": "lo"},
            "etcd": {
                "endpoints": [f"https://{expiring_etcd.endpoint}"],
                "ca_file": str(pki.ca),
                "cert_file": str(pki.node[0]),
                "key_file": str(pki.node[1]),
                "user": "shiftd",
                "password_file": str(password_file),
                "lease_ttl_seconds": 60,  # no keep-alive while the token goes unused
                "timeout_seconds": 2.0,
            },
        },
    )
    daemon.start()
    try:
        assert wait_until(lambda: stored(expiring_etcd, "/shift/v1/hosts/t0"), timeout=20), daemon.log()
        time.sleep(TOKEN_TTL + 2)  # the daemon's token expires
        mapping = common_pb2.QpMapping(
            primary=common_pb2.Endpoint(gid="::ffff:127.0.0.1", qpn=42, psn=1, device="mlx5_0"),
            backup=common_pb2.Endpoint(gid="::ffff:127.0.0.2", qpn=142, psn=7, device="mlx5_1"),
        )
        with daemon.channel() as channel:
            agent = daemon.agent(channel)
            agent_id = agent.Register(agent_pb2.RegisterRequest(name="t"), timeout=10).agent_id
            agent.Publish(agent_pb2.PublishRequest(agent_id=agent_id, qps=[mapping]), timeout=10)
            key = "/shift/v1/qp/::ffff:127.0.0.1/42"
            assert wait_until(lambda: stored(expiring_etcd, key), timeout=15), daemon.log()
            found = agent.LookupQp(agent_pb2.LookupQpRequest(gid="::ffff:127.0.0.1", qpn=42), timeout=10)
            assert found.mapping.backup.qpn == 142
    except grpc.RpcError as exc:
        pytest.fail(f"daemon call failed: {exc}\n{daemon.log()}")
    finally:
        daemon.stop()
    assert "etcd: auth" not in daemon.log()  # the renewal is silent
    assert (
        stored(expiring_etcd, "/shift/v1/hosts/t0") is None
    )  # SIGTERM revoked the lease, through TLS and auth
