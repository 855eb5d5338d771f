"""Start and stop a local etcd member: the lab's out-of-band store and the tests' real etcd.

etcd is Debian's `etcd-server`. A member runs in its own data directory, optionally inside a
network namespace (`ip netns exec`), and is ended by PID only.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from shiftlab.pids import end


class EtcdError(RuntimeError):
    pass


_handed_out: set[int] = set()


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now and that this process has not handed
    out before: the kernel may give two calls in a row the same free port, and two members of one
    cluster then got the same peer URL."""
    for _ in range(1000):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise RuntimeError("no loopback port left that was not handed out already")


@dataclass(frozen=True)
class EtcdTLS:
    """TLS on a member's client port: what it serves, whom it admits, and what etcdctl presents."""

    ca_file: Path  # trusted CA (--trusted-ca-file): signs the server's and the clients' certificates
    cert_file: Path  # the server's certificate and key
    key_file: Path
    client_cert_file: Path | None = None  # etcdctl's own certificate, needed with client_cert_auth
    client_key_file: Path | None = None
    client_cert_auth: bool = True  # refuse clients without a certificate signed by ca_file

    def server_flags(self) -> list[str]:
        flags = ["--cert-file", str(self.cert_file), "--key-file", str(self.key_file)]
        flags += ["--trusted-ca-file", str(self.ca_file)]
        return flags + (["--client-cert-auth"] if self.client_cert_auth else [])

    def etcdctl_flags(self) -> list[str]:
        flags = ["--cacert", str(self.ca_file)]
        if self.client_cert_file and self.client_key_file:
            flags += ["--cert", str(self.client_cert_file), "--key", str(self.client_key_file)]
        return flags


@dataclass
class EtcdProcess:
    """One etcd member. `client_host:client_port` is where clients reach it."""

    data_dir: Path
    name: str = "default"
    client_host: str = "127.0.0.1"
    client_port: int = field(default_factory=free_port)
    peer_port: int = field(default_factory=free_port)
    netns: str | None = None
    log_path: Path | None = None
    initial_cluster: str | None = None  # "name=http://host:port,..." for a multi-member cluster
    cluster_state: str = "new"
    tls: EtcdTLS | None = None  # TLS on the client port (the peer port stays plain http)
    auth_token_ttl: int | None = None  # seconds an unused simple token lives (etcd's default: 300)
    root_password: str | None = None  # set by enable_auth(); etcdctl() then runs as root
    proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.client_host}:{self.client_port}"

    @property
    def client_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.endpoint}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.client_host}:{self.peer_port}"

    def command(self) -> list[str]:
        etcd = shutil.which("etcd") or "/usr/bin/etcd"
        client_url = self.client_url
        cmd = [
            etcd,
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", client_url,
            "--advertise-client-urls", client_url,
            "--listen-peer-urls", self.peer_url,
            "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", self.initial_cluster or f"{self.name}={self.peer_url}",
            "--initial-cluster-state", self.cluster_state,
            "--log-level", "warn",
            "--logger", "zap",
        ]  # fmt: skip
        if self.tls:
            cmd += self.tls.server_flags()
        if self.auth_token_ttl is not None:
            cmd += ["--auth-token-ttl", str(self.auth_token_ttl)]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns, *cmd]
        return cmd

    def start(self, wait: float = 15.0) -> None:
        """Start etcd and wait until it accepts client connections."""
        if self.running:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.data_dir, 0o700)
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True
            )
        finally:
            if self.log_path:
                log.close()
        self.wait_ready(wait)

    def wait_ready(self, wait: float) -> None:
        deadline = time.monotonic() + wait
        pause = 0.05
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise EtcdError(f"etcd exited with status {self.proc.returncode}; see {self.log_path}")
            if self._healthy():
                return
            time.sleep(pause)
            pause = min(2 * pause, 0.5)  # each look runs etcdctl, which a slow machine (a VM) feels
        raise EtcdError(f"etcd did not become ready at {self.endpoint} within {wait:.0f}s")

    def _healthy(self) -> bool:
        result = self._etcdctl(["--dial-timeout", "1s", "endpoint", "health"], None)
        return result.returncode == 0

    def _etcdctl(self, args: list[str], user: str | None) -> subprocess.CompletedProcess[str]:
        """Run etcdctl against this member, with its TLS files and as `user` ("name:password")."""
        cmd = ["etcdctl", "--endpoints", self.client_url]
        if self.tls:
            cmd += self.tls.etcdctl_flags()
        if user:
            cmd += ["--user", user]
        cmd += args
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns, *cmd]
        env = {**os.environ, "ETCDCTL_API": "3"}
        return subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        """End this member (only the process this object started) and reap it."""
        if self.proc is not None:
            end(self.proc, sig, timeout)
        self.proc = None

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def etcdctl(self, *args: str, user: str | None = None) -> str:
        """Run etcdctl against this member and return its output; as root once auth is enabled."""
        if user is None and self.root_password is not None:
            user = f"root:{self.root_password}"
        result = self._etcdctl(list(args), user)
        if result.returncode != 0:
            raise EtcdError(f"etcdctl {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def enable_auth(self, root_password: str) -> None:
        """Create the root user and turn etcd's auth on: from now on every client needs a user."""
        self.etcdctl("user", "add", f"root:{root_password}")
        self.etcdctl("auth", "enable")
        self.root_password = root_password

    def add_prefix_user(self, user: str, password: str, role: str, prefix: str) -> None:
        """A user whose one role may read and write the keys under `prefix`, and nothing else."""
        self.etcdctl("role", "add", role)
        self.etcdctl("role", "grant-permission", role, "--prefix=true", "readwrite", prefix)
        self.etcdctl("user", "add", f"{user}:{password}")
        self.etcdctl("user", "grant-role", user, role)
