"""The registry's credentials for etcd: TLS with a client certificate, and an etcd user's token.

aetcd opens a plaintext channel and fetches an auth token once, at connect, and never again;
etcd's tokens expire (a simple token after `--auth-token-ttl` without use, a JWT at a fixed
time), so a long-running daemon would be locked out for good. `SecureClient` therefore opens
the channel itself (TLS credentials when configured) and attaches `TokenAuth` as a gRPC
interceptor: every call on the channel (aetcd's stubs and the registry's own Watch streams)
carries the current token, a unary call that etcd refuses with "invalid auth token" is retried
once with a fresh one, and anyone may `invalidate()` a token that a stream saw refused.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aetcd
import grpc
from aetcd import rpc, watcher

from shiftd.config import read_secret

if TYPE_CHECKING:
    from shiftd.config import EtcdConfig

log = logging.getLogger("shiftd.registry")
AUTHENTICATE = "/etcdserverpb.Auth/Authenticate"
INVALID_TOKEN = "invalid auth token"
AUTH_DISABLED = "authentication is not enabled"
USER_EMPTY = "user name is empty"  # etcd's answer to a call without a token once auth is on


class EtcdAuthError(RuntimeError):
    """etcd refused the configured user, or a credential file is unusable; str() is one line."""


@dataclass(frozen=True)
class EtcdSecurity:
    """How shiftd proves itself to etcd, and checks that it talks to etcd. Empty fields are unset."""

    ca_file: str = ""  # set: TLS, with etcd's server certificates checked against this CA
    cert_file: str = ""  # client certificate, for etcd's --client-cert-auth
    key_file: str = ""
    server_name: str = ""  # the name the server certificates must hold (default: the endpoint's host)
    user: str = ""  # set: authenticate as this etcd user
    password_file: str = ""  # read at each authentication, so a rotated password needs no restart

    @classmethod
    def from_config(cls, config: EtcdConfig) -> EtcdSecurity:
        return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls)})

    @property
    def tls(self) -> bool:
        return bool(self.ca_file)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """TLS credentials from the files as they are now (renewed certificates count at the next open)."""
        return grpc.ssl_channel_credentials(
            root_certificates=_read("ca_file", self.ca_file),
            private_key=_read("key_file", self.key_file) if self.key_file else None,
            certificate_chain=_read("cert_file", self.cert_file) if self.cert_file else None,
        )


def _read(key: str, path: str) -> bytes:
    """A credential file; gone or unreadable since the config was checked is one line, not a traceback."""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise EtcdAuthError(f"etcd.{key}: {path}: {exc.strerror}") from None


class TokenAuth:
    """An etcd user's token: obtained lazily, obtained again after etcd refused it as expired."""

    def __init__(self, user: str, password_file: str, timeout: float) -> None:
        self.user = user
        self.password_file = password_file
        self.timeout = timeout
        self._token: str | None = None
        self._lock = asyncio.Lock()
        self._stub: rpc.AuthStub | None = None
        self.authentications = 0  # tokens obtained so far (a token expiry shows as one more)

    def interceptors(self) -> list[grpc.aio.ClientInterceptor]:
        """One interceptor per call shape: gRPC files each interceptor under its first shape only."""
        return [_UnaryUnary(self), _UnaryStream(self), _StreamUnary(self), _StreamStream(self)]

    def bind(self, channel: grpc.aio.Channel) -> None:
        """Authenticate through `channel`, the one the interceptors are attached to."""
        self._stub = rpc.AuthStub(channel)
        self._token = None

    def invalidate(self, token: str | None = None) -> None:
        """Forget the token (only `token`, if given, so that a newer one survives a late report)."""
        if token is None or token == self._token:
            self._token = None

    async def token(self) -> str:
        """The current token ("" while etcd's auth is off), authenticating first when there is none."""
        async with self._lock:
            if self._token is None:
                self._token = await self._authenticate()
            return self._token

    async def attach(self, details: grpc.aio.ClientCallDetails) -> tuple[grpc.aio.ClientCallDetails, str]:
        """`details` with the token added to its metadata, and that token."""
        token = await self.token()
        if not token:
            return details, token
        metadata = grpc.aio.Metadata(*(details.metadata or ()), ("token", token))
        return details._replace(metadata=metadata), token

    async def _authenticate(self) -> str:
        if self._stub is None:
            raise RuntimeError("TokenAuth is not bound to a channel")
        try:
            password = read_secret(self.password_file)
        except OSError as exc:
            raise EtcdAuthError(f"etcd.password_file: {self.password_file}: {exc.strerror}") from None
        request = rpc.AuthenticateRequest(name=self.user, password=password)
        try:
            reply = await self._stub.Authenticate(request, timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            if AUTH_DISABLED in (exc.details() or ""):
                # Configured before `etcdctl auth enable` (the order of a rollout): go without a
                # token; once auth is on, etcd's "user name is empty" makes the link invalidate it.
                log.info("etcd: auth is not enabled in etcd; user %r is not needed yet", self.user)
                return ""
            if exc.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION):
                raise EtcdAuthError(f"etcd refused user {self.user!r}: {exc.details()}") from None
            raise
        self.authentications += 1
        return reply.token


class _Interceptor:
    def __init__(self, auth: TokenAuth) -> None:
        self._auth = auth

    async def _call(self, continuation: Any, details: Any, arg: Any) -> Any:
        return await continuation((await self._auth.attach(details))[0], arg)


class _UnaryUnary(_Interceptor, grpc.aio.UnaryUnaryClientInterceptor):
    """Unary calls are retried once when etcd refused a stale token; Authenticate goes bare."""

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        if _method(details) == AUTHENTICATE:
            return await continuation(details, request)
        for attempt in (1, 2):
            with_token, token = await self._auth.attach(details)
            call = await continuation(with_token, request)
            try:
                return await call
            except grpc.aio.AioRpcError as exc:
                if attempt == 2 or not _stale(token, exc.details() or ""):
                    raise
                self._auth.invalidate(token)
        raise AssertionError("unreachable")


class _UnaryStream(_Interceptor, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await self._call(continuation, details, request)


class _StreamUnary(_Interceptor, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await self._call(continuation, details, request_iterator)


class _StreamStream(_Interceptor, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await self._call(continuation, details, request_iterator)


class SecureClient(aetcd.Client):
    """aetcd's client over a channel with TLS credentials and/or a `TokenAuth` interceptor."""

    def __init__(
        self,
        host: str,
        port: int,
        security: EtcdSecurity,
        timeout: float,
        options: dict[str, Any],
        auth: TokenAuth | None,
    ) -> None:
        super().__init__(host, port, timeout=timeout, options=options)
        self._security = security
        self.auth = auth

    async def connect(self) -> None:
        """aetcd's connect with our channel; it awaits nothing, so two callers cannot race."""
        if self._connected.is_set():
            return
        target = f"{self._host}:{self._port}"
        options = list(self._options.items())
        interceptors = self.auth.interceptors() if self.auth is not None else None
        if self._security.tls:
            credentials = self._security.channel_credentials()
            channel = grpc.aio.secure_channel(target, credentials, options=options, interceptors=interceptors)
        else:
            channel = grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)
        if self.auth is not None:
            self.auth.bind(channel)
        self.channel = channel
        self.kvstub = rpc.KVStub(channel)
        self.clusterstub = rpc.ClusterStub(channel)
        self.leasestub = rpc.LeaseStub(channel)
        self.maintenancestub = rpc.MaintenanceStub(channel)
        self._watcher = watcher.Watcher(rpc.WatchStub(channel), timeout=self._timeout)
        self._connected.set()


def _stale(token: str, details: str) -> bool:
    """Whether etcd refused `token` as expired, or the lack of one because auth is on now."""
    return INVALID_TOKEN in details or (not token and USER_EMPTY in details)


def _method(details: grpc.aio.ClientCallDetails) -> str:
    method = details.method
    return method.decode() if isinstance(method, bytes) else method
