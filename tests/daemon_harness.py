"""Run a real shiftd process for a test: its own config, socket and log, ended by PID."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from libshift.api.shift.v1 import admin_pb2_grpc, agent_pb2_grpc
from shiftd.config import Config, DampingConfig, MetricsConfig, MonitorsConfig, ServerConfig
from shiftd.daemon import Daemon
from shiftlab.etcdproc import free_port
from shiftlab.pids import end

SYSFS = Path(__file__).parent / "fixtures" / "sysfs"


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_config(sections: dict[str, dict]) -> str:
    """TOML text for {"": top-level keys, "server": {...}, ...}."""
    lines = [f"{k} = {toml_value(v)}" for k, v in sections.get("", {}).items()]
    for name, values in sections.items():
        if name:
            lines.append(f"[{name}]")
            lines += [f"{k} = {toml_value(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


@dataclass
class DaemonProcess:
    workdir: Path
    netns: str | None = None
    sections: dict[str, dict] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        defaults = {
            "": {"host": "t0", "log_level": "debug"},
            "server": {"socket": str(self.workdir / "shiftd.sock")},
            # nothing listens there: the daemon must serve without etcd unless a test says otherwise
            "etcd": {"endpoints": [f"127.0.0.1:{free_port()}"], "timeout_seconds": 0.5},
            "metrics": {"listen": f"127.0.0.1:{free_port()}"},
            "health": {"hold_down_seconds": 0.3},
            # no flap damping: a module's tests bounce the same links one after another, and the default
            # half-life (60 s) would hold a NIC DOWN into the next test; the damping tests say otherwise
            "damping": {"penalty": 0},
        }
        for name, values in self.sections.items():
            defaults.setdefault(name, {}).update(values)
        self.sections = defaults
        self.config_path = self.workdir / "shiftd.toml"
        self.config_path.write_text(render_config(self.sections))
        self.log_path = self.workdir / "shiftd.log"

    @property
    def socket(self) -> str:
        return self.sections["server"]["socket"]

    @property
    def metrics_address(self) -> str:
        return self.sections["metrics"]["listen"]

    def start(self, timeout: float = 20.0) -> None:
        cmd = [sys.executable, "-m", "shiftd.daemon", "--config", str(self.config_path)]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns, *cmd]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL, env={**os.environ, **self.env}
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"shiftd exited with {self.proc.returncode}:\n{self.log()}")
            if _accepts(self.socket):
                return
            time.sleep(0.05)
        raise RuntimeError(f"shiftd did not open {self.socket} within {timeout}s:\n{self.log()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
        if self.proc is None:
            return None
        code, self.proc = end(self.proc, sig, timeout), None
        return code

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def channel(self) -> grpc.Channel:
        return grpc.insecure_channel(f"unix:{self.socket}")

    def admin(self, channel: grpc.Channel) -> admin_pb2_grpc.AdminStub:
        return admin_pb2_grpc.AdminStub(channel)

    def agent(self, channel: grpc.Channel) -> agent_pb2_grpc.AgentStub:
        return agent_pb2_grpc.AgentStub(channel)


def _accepts(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError:
            return False
        return True


def offline_daemon(workdir: Path, host: str = "h0", damping: DampingConfig | None = None) -> Daemon:
    """A Daemon in this process, never started: the NICs of tests/fixtures/sysfs plus tcp0 on lo, its socket
    under `workdir`, metrics not listening. For tests of its state and what it exports; no etcd is called."""
    return Daemon(
        Config(
            host=host,
            server=ServerConfig(socket=str(workdir / "shiftd.sock")),
            metrics=MetricsConfig(listen=""),
            monitors=MonitorsConfig(sysfs_root=str(SYSFS)),
            damping=damping or DampingConfig(),
            devices={"tcp0": "lo"},
        )
    )
