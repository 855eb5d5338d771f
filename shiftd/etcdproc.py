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


class EtcdError(RuntimeError):
    pass


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
    proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.client_host}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.client_host}:{self.peer_port}"

    def command(self) -> list[str]:
        etcd = shutil.which("etcd") or "/usr/bin/etcd"
        client_url = f"http://{self.client_host}:{self.client_port}"
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
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise EtcdError(f"etcd exited with status {self.proc.returncode}; see {self.log_path}")
            if self._healthy():
                return
            time.sleep(0.05)
        raise EtcdError(f"etcd did not become ready at {self.endpoint} within {wait:.0f}s")

    def _healthy(self) -> bool:
        cmd = ["etcdctl", "--endpoints", self.endpoint, "--dial-timeout", "1s", "endpoint", "health"]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns, *cmd]
        env = {**os.environ, "ETCDCTL_API": "3"}
        result = subprocess.run(cmd, capture_output=True, env=env, check=False)
        return result.returncode == 0

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        """End this member (only the process this object started) and reap it."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def etcdctl(self, *args: str) -> str:
        """Run etcdctl against this member and return its output."""
        cmd = ["etcdctl", "--endpoints", self.endpoint, *args]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns, *cmd]
        env = {**os.environ, "ETCDCTL_API": "3"}
        result = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if result.returncode != 0:
            raise EtcdError(f"etcdctl {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout
