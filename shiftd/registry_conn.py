"""The registry's link to etcd: one aetcd client over every member, error accounting, backoff.

The client speaks TLS and etcd auth when configured (`registry_auth.py`).

Everything that talks to etcd (the reconciler, lookups, watches) goes through one `EtcdLink` so
that errors are counted once, `connected` means the same thing everywhere, and `stop()` has one
switch (`closed`) that ends every loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import random
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TypeVar

import aetcd
import grpc
from aetcd import rpc

from shiftd.registry_auth import (
    INVALID_TOKEN,
    USER_EMPTY,
    EtcdAuthError,
    EtcdSecurity,
    SecureClient,
    TokenAuth,
)

log = logging.getLogger("shiftd.registry")
T = TypeVar("T")
Endpoint = tuple[str, int]
MAX_WARNED = 16  # distinct failure reasons remembered per outage (gRPC's texts name addresses)


class RegistryUnavailable(RuntimeError):
    """etcd did not answer within the timeout; str() is the one line shown to a user."""


def grpc_target(endpoints: list[Endpoint]) -> tuple[str, int]:
    """Return the (host, port) that makes aetcd dial every member through one gRPC channel.

    aetcd dials f"{host}:{port}". gRPC fails over between addresses only inside one target, so
    several members become gRPC's static list target "ipv4:a:p,b:p,c:p", split at its last colon
    so that aetcd's join rebuilds it. A single endpoint may be a DNS name; a list must be IPs
    (the static resolver does no DNS).
    """
    if not endpoints:
        raise ValueError("etcd: no endpoints configured")
    if len(endpoints) == 1:
        return endpoints[0]
    versions = set()
    for host, _ in endpoints:
        try:
            versions.add(ipaddress.ip_address(host).version)
        except ValueError:
            raise ValueError(
                f"etcd endpoint {host!r}: with several endpoints each must be an IP address"
            ) from None
    if len(versions) > 1:
        raise ValueError("etcd endpoints: do not mix IPv4 and IPv6 addresses")
    if versions == {4}:
        target = "ipv4:" + ",".join(f"{h}:{p}" for h, p in endpoints)
    else:
        target = "ipv6:" + ",".join(f"[{h}]:{p}" for h, p in endpoints)
    host, _, port = target.rpartition(":")
    return host, int(port)


def spread_endpoints(endpoints: list[Endpoint], host: str) -> list[Endpoint]:
    """The endpoints rotated by a hash of the host's name: pick_first then starts each daemon on its
    own member (the same one every time), so a fleet shares the members out instead of all using the
    first, and a member's loss moves only the daemons that were on it."""
    if len(endpoints) < 2:
        return list(endpoints)
    turn = zlib.crc32(host.encode()) % len(endpoints)
    return endpoints[turn:] + endpoints[:turn]


def tls_server_name(endpoints: list[Endpoint], security: EtcdSecurity) -> str:
    """The name etcd's certificates are checked against, when gRPC's own choice would be wrong.

    One endpoint: its host, gRPC's default. Several: gRPC would check the whole list target
    ("a:p,b:p"), which no certificate holds, so every member's certificate must hold one name,
    `server_name`.
    """
    if not security.tls or security.server_name:
        return security.server_name
    if len(endpoints) > 1:
        raise ValueError("etcd.server_name: required with several https:// endpoints")
    return ""


def error_kind(exc: BaseException) -> str:
    """A short, bounded label for an etcd failure (the `kind` of shift_etcd_errors_total)."""
    if isinstance(exc, EtcdAuthError | aetcd.exceptions.UnauthenticatedError) or _refused(str(exc)):
        return "auth"
    if isinstance(exc, aetcd.ConnectionFailedError):
        return "unavailable"
    if isinstance(exc, aetcd.ConnectionTimeoutError | TimeoutError):
        return "timeout"
    if "lease not found" in str(exc):
        return "lease_lost"
    if isinstance(exc, grpc.aio.AioRpcError):
        if exc.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            return "auth"
        return {grpc.StatusCode.UNAVAILABLE: "unavailable", grpc.StatusCode.DEADLINE_EXCEEDED: "timeout"}.get(
            exc.code(), "rpc"
        )
    if isinstance(exc, aetcd.ClientError):
        return "rpc"
    return "internal"


def _refused(text: str) -> bool:
    """etcd's words for "who are you?" and "not this key" (also in a cancelled watch's reason)."""
    return any(words in text for words in (INVALID_TOKEN, "permission denied", USER_EMPTY))


class Backoff:
    """Exponential backoff with jitter, so that a fleet of daemons does not reconnect in step."""

    def __init__(self, initial: float, maximum: float) -> None:
        self._initial = initial
        self._maximum = max(initial, maximum)
        self._current = initial

    def next(self) -> float:
        delay = self._current * random.uniform(0.75, 1.0)
        self._current = min(self._current * 2, self._maximum)
        return delay

    def reset(self) -> None:
        self._current = self._initial


class EtcdLink:
    """One aetcd client for all members, plus the bookkeeping every caller shares."""

    def __init__(
        self,
        endpoints: list[Endpoint],
        timeout: float,
        retry_initial: float,
        retry_max: float,
        on_error: Callable[[str], None] | None,
        security: EtcdSecurity | None = None,
    ) -> None:
        self.endpoints = endpoints
        self.timeout = timeout
        self.retry_initial = retry_initial
        self.retry_max = retry_max
        self._target = grpc_target(endpoints)
        self._security = security or EtcdSecurity()
        self._server_name = tls_server_name(endpoints, self._security)
        self._on_error = on_error
        self._client: SecureClient | None = None
        self.errors: Counter[str] = Counter()
        self.connected = False
        self._warned: set[str] = set()  # failures logged as warnings since etcd last answered
        self.closed = asyncio.Event()

    @property
    def client(self) -> SecureClient:
        if self._client is None:
            raise RuntimeError("registry is not started")
        return self._client

    def open(self) -> None:
        """Create the client; gRPC connects lazily, so this never waits for etcd."""
        options: dict[str, str | int] = {
            # gRPC's own reconnect backoff grows to 120 s by default: cap it at ours so that a
            # restarted etcd is found within retry_max.
            "grpc.initial_reconnect_backoff_ms": _ms(self.retry_initial),
            # gRPC gives a connection attempt this long (its MIN_CONNECT_TIMEOUT): at retry_initial
            # (0.2 s), a loaded etcd's handshakes timed out over and over after a member's loss (a
            # fleet of 300 reconnecting at once, bench/fleet_scale.py); the registry's timeout it is.
            "grpc.min_reconnect_backoff_ms": _ms(max(self.retry_initial, self.timeout)),
            "grpc.max_reconnect_backoff_ms": _ms(self.retry_max),
            # A member that is alive to TCP but answers nothing (frozen, overloaded, cut off
            # without RST) must lose its connection, or pick_first keeps sending every call,
            # watches included, to it. gRPC notices only through an unanswered HTTP/2 ping, and
            # waits a minute for one (ping_timeout) whatever keepalive_timeout says, and sends no
            # keepalive ping while another ping is unanswered: bound every ping by the timeout.
            # Pings every 6 s: etcd's floor is 5 s (--grpc-keepalive-min-time), closer gets GOAWAY.
            "grpc.keepalive_time_ms": 6_000,
            # A connection of its own: gRPC shares one between channels of a process with the same
            # target, and the fleet bench's hundreds of registries in one process then put every
            # call and watch on one HTTP/2 connection, which no daemon does.
            "grpc.use_local_subchannel_pool": 1,
            "grpc.keepalive_timeout_ms": _ms(self.timeout),
            "grpc.http2.ping_timeout_ms": _ms(self.timeout),
        }
        if self._server_name:
            options["grpc.ssl_target_name_override"] = self._server_name
        security = self._security
        auth = TokenAuth(security.user, security.password_file, self.timeout) if security.user else None
        host, port = self._target
        self._client = SecureClient(host, port, security, self.timeout, options, auth)
        self.closed.clear()

    async def close(self) -> None:
        """Close the channel (cancelling every call on it); bounded by the timeout."""
        self.closed.set()
        client, self._client = self._client, None
        if client is None:
            return
        try:
            await asyncio.wait_for(client.close(), self.timeout)
        except Exception as exc:
            log.warning("etcd: closing the client failed: %s", exc)

    def ok(self) -> None:
        if not self.connected:
            log.info("etcd: reachable at %s", self.describe())
        self.connected = True
        self._warned.clear()

    def failed(self, exc: BaseException) -> str:
        """Count and report one failed etcd call; returns its kind."""
        kind = error_kind(exc)
        if kind == "internal":
            log.error("etcd: unexpected error", exc_info=exc)
        if kind == "auth" and self._client is not None and self._client.auth is not None:
            # etcd cancels a watch created with an expired token ("invalid auth token"; unary
            # calls renew it themselves): the next call must authenticate again.
            self._client.auth.invalidate()
        self.report(kind, one_line(exc))
        return kind

    def report(self, kind: str, detail: str) -> None:
        """Count one etcd error, tell `on_error`, and log it once per outage, not once per retry."""
        self.errors[kind] += 1
        # Each distinct reason is a warning once until etcd answers again, also before it ever
        # answered (a wrong password or CA at start must be seen); its retries are debug lines.
        reason = f"{kind}: {detail}"
        if reason in self._warned or len(self._warned) >= MAX_WARNED:
            log.debug("etcd: %s: %s", kind, detail)
        else:
            self._warned.add(reason)
            log.warning("etcd: %s at %s: %s", kind, self.describe(), detail)
        if kind != "lease_lost":  # etcd answered: the link itself is fine
            self.connected = False
        if self._on_error is not None:
            try:
                self._on_error(kind)
            except Exception:
                log.exception("etcd: on_error callback failed")

    def backoff(self) -> Backoff:
        """A fresh backoff for one retry loop, from retry_initial up to retry_max."""
        return Backoff(self.retry_initial, self.retry_max)

    def describe(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.endpoints)

    async def sleep(self, delay: float) -> None:
        """Sleep, but wake at once when the registry stops."""
        await wait_event(self.closed, delay)

    async def call(self, fn: Callable[[], Awaitable[T]]) -> T:
        """Run one etcd request, retrying transient failures until the timeout is spent."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        backoff = Backoff(min(self.retry_initial, 0.05), self.retry_max)
        while True:
            remaining = deadline - loop.time()
            try:
                result = await asyncio.wait_for(fn(), max(remaining, 0.001))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                kind = self.failed(exc)
                if kind == "internal":
                    raise
                if kind == "auth":  # etcd answered, and will answer the same again
                    raise RegistryUnavailable(f"etcd at {self.describe()}: {one_line(exc)}") from exc
                delay = backoff.next()
                if loop.time() + delay >= deadline:
                    why = f"{kind}: {one_line(exc)}"
                    raise RegistryUnavailable(
                        f"etcd at {self.describe()} did not answer within {self.timeout:g}s ({why})"
                    ) from exc
                await asyncio.sleep(delay)
            else:
                self.ok()
                return result

    async def snapshot(self, key: bytes, range_end: bytes) -> tuple[int, list[rpc.KeyValue]]:
        """The keys in [key, range_end) and the store revision they were read at."""
        result = await self.call(lambda: self.client.get_range(key, range_end))
        return result.header.revision, list(result.kvs)

    async def watch_stub(self) -> rpc.WatchStub:
        await self.client.connect()
        return rpc.WatchStub(self.client.channel)


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


async def wait_event(event: asyncio.Event, timeout: float) -> None:
    """Wait until `event` is set or `timeout` passes, whichever is first."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout)


def one_line(exc: BaseException) -> str:
    """An error as one log line (gRPC errors' str() spans several)."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
