"""deploy/systemd and scripts/install.sh: the staged install, the unit as systemd itself reads
it, and shiftd speaking the notify/watchdog protocol the unit relies on (Type=notify,
WatchdogSec) to a real datagram socket, as systemd listens for it."""

from __future__ import annotations

import configparser
import grp
import itertools
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from daemon_harness import DaemonProcess, _accepts
from nsutil import ip, netns

from libshift.api.shift.v1 import admin_pb2, common_pb2

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "deploy" / "systemd" / "shiftd.service"
PREFIX = "/opt/shift"  # not the unit's own /usr/local, so the rewrite shows
WATCHDOG_USEC = 1_000_000  # shiftd pings every half of it
MAX_EXPOSURE = 3.0  # systemd-analyze security: 0 is locked down, 10 is fully exposed


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is missing: install Debian's systemd package", pytrace=False)
    return path


def install(destdir: Path) -> subprocess.CompletedProcess:
    venv = Path(sys.executable).parent.parent
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "install.sh"), "--prefix", PREFIX, "--venv", str(venv)],
        env={**os.environ, "DESTDIR": str(destdir)},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def staged(tmp_path) -> Path:
    result = install(tmp_path)
    assert result.returncode == 0, result.stderr
    return tmp_path


def service_section(path: Path) -> configparser.SectionProxy:
    unit = configparser.ConfigParser(interpolation=None, strict=True)
    unit.optionxform = str  # systemd keys are case-sensitive
    unit.read(path)
    return unit["Service"]


def test_install_stages_scripts_unit_groups_and_config(staged):
    bindir = staged / PREFIX.lstrip("/") / "bin"
    assert (bindir / "shiftd").resolve() == (Path(sys.executable).parent / "shiftd").resolve()
    assert os.access(bindir / "shiftctl", os.X_OK)
    unit = service_section(staged / PREFIX.lstrip("/") / "lib/systemd/system/shiftd.service")
    assert unit["ExecStart"] == f"{PREFIX}/bin/shiftd --config /etc/shift/shiftd.toml"
    assert unit["ExecStartPre"].startswith(f"{PREFIX}/bin/shiftd ")
    config = staged / "etc/shift/shiftd.toml"
    assert config.read_text() == (REPO / "deploy/config/shiftd.toml").read_text()
    # the sysusers file really creates both groups
    sysusers = staged / PREFIX.lstrip("/") / "lib/sysusers.d/shift.conf"
    created = subprocess.run(
        [tool("systemd-sysusers"), f"--root={staged}", str(sysusers)], capture_output=True, text=True
    )
    assert created.returncode == 0, created.stderr
    groups = {line.split(":")[0] for line in (staged / "etc/group").read_text().splitlines()}
    assert groups == {"shift", "shift-admin"}


def test_install_keeps_an_existing_config(staged):
    config = staged / "etc/shift/shiftd.toml"
    config.write_text('host = "edited"\n')
    again = install(staged)
    assert again.returncode == 0, again.stderr
    assert config.read_text() == 'host = "edited"\n'
    assert "keeping the existing" in again.stdout


@pytest.mark.lab
def test_install_on_a_host_builds_an_environment_and_creates_the_groups(tmp_path):
    """What `make install` does, on a host of its own: a mount namespace whose /etc is a copy
    (config and groups land there) and that hides systemd (no daemon-reload of the real one)."""
    subprocess.run(["cp", "-a", "/etc", str(tmp_path / "etc")], check=True)
    prefix = tmp_path / "prefix"
    script = f"""set -e
        mount --make-rprivate /
        mount --bind {tmp_path}/etc /etc
        if [ -d /run/systemd ]; then mount -t tmpfs dp-nosystemd /run/systemd; fi
        PYTHON={sys.executable} bash {REPO}/scripts/install.sh --prefix {prefix}
        {prefix}/bin/shiftd --config /etc/shift/shiftd.toml --check-config
        getent group shift shift-admin"""
    result = subprocess.run(["unshare", "--mount", "bash", "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (prefix / "lib/shift/bin/shiftd").exists()
    assert (prefix / "bin/shiftd").resolve() == (prefix / "lib/shift/bin/shiftd").resolve()
    assert "/etc/shift/shiftd.toml: OK" in result.stdout
    assert [line.split(":")[0] for line in result.stdout.splitlines()[-2:]] == ["shift", "shift-admin"]
    assert (tmp_path / "etc/shift/shiftd.toml").exists()


def test_install_refuses_to_stage_without_an_environment(tmp_path):
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "install.sh"), "--destdir", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "needs --venv" in result.stderr
    assert not any(tmp_path.iterdir())


def test_installed_unit_passes_systemd_analyze_verify(staged):
    """systemd checks the unit for real: keys, values, and that ExecStart is executable. The
    staged unit points at PREFIX; the copy points at the staged links instead."""
    installed = staged / PREFIX.lstrip("/") / "lib/systemd/system"
    copies = [staged / "shiftd.service", staged / "shiftd.socket"]
    for copy in copies:
        text = (installed / copy.name).read_text()
        copy.write_text(text.replace(f"{PREFIX}/bin/", f"{staged}{PREFIX}/bin/"))
    result = subprocess.run(
        [tool("systemd-analyze"), "verify", "--man=no", *map(str, copies)], capture_output=True, text=True
    )
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_the_socket_unit_holds_the_daemons_socket_across_restarts():
    """shiftd.socket listens where the config says shiftd serves; the service needs it and keeps the
    directory the socket lives in when it stops."""
    socket_unit = configparser.ConfigParser(interpolation=None, strict=True)
    socket_unit.optionxform = str
    socket_unit.read(UNIT.with_name("shiftd.socket"))
    config = (REPO / "deploy/config/shiftd.toml").read_text()
    path = socket_unit["Socket"]["ListenStream"]
    assert f'socket = "{path}"' in config
    assert (socket_unit["Socket"]["SocketMode"], socket_unit["Socket"]["SocketGroup"]) == ("0660", "shift")
    unit = configparser.ConfigParser(interpolation=None, strict=True)
    unit.optionxform = str
    unit.read(UNIT)
    assert "shiftd.socket" in unit["Unit"]["Requires"].split()
    assert unit["Service"]["RuntimeDirectoryPreserve"] == "yes"


def test_unit_is_hardened():
    unit = service_section(UNIT)
    assert unit["Type"] == "notify"
    assert unit["Restart"] == "on-failure"
    assert int(unit["WatchdogSec"]) > 0
    assert unit["RuntimeDirectory"] == "shift"
    assert unit["ProtectSystem"] == "strict"
    for key in ("ProtectHome", "NoNewPrivileges", "PrivateTmp"):
        assert unit[key] == "yes", key
    assert set(unit["CapabilityBoundingSet"].split()) == {"CAP_NET_ADMIN", "CAP_CHOWN"}
    assert set(unit["AmbientCapabilities"].split()) == {"CAP_NET_ADMIN", "CAP_CHOWN"}
    assert set(unit["RestrictAddressFamilies"].split()) == {"AF_UNIX", "AF_NETLINK", "AF_INET", "AF_INET6"}


def test_systemd_security_exposure_stays_low():
    result = subprocess.run(
        [tool("systemd-analyze"), "security", "--offline=yes", "--no-pager", str(UNIT)],
        capture_output=True,
        text=True,
    )
    found = re.search(r"Overall exposure level for shiftd\.service: (\d+\.\d+)", result.stdout)
    assert found, result.stdout + result.stderr
    assert float(found.group(1)) <= MAX_EXPOSURE


@dataclass
class NotifyListener:
    """Records what shiftd sends to NOTIFY_SOCKET, and whether its socket accepted at READY."""

    path: Path
    daemon_socket: str
    messages: list[tuple[float, list[str]]] = field(default_factory=list)
    accepted_at_ready: bool | None = None

    def __post_init__(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.path))
        self.sock.settimeout(0.1)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.is_set():
            try:
                fields = self.sock.recv(4096).decode().split("\n")
            except TimeoutError:
                continue
            if "READY=1" in fields:
                self.accepted_at_ready = _accepts(self.daemon_socket)
            self.messages.append((time.monotonic(), fields))

    def times(self, message: str) -> list[float]:
        return [at for at, fields in self.messages if message in fields]

    def wait_for(self, message: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.times(message) and time.monotonic() < deadline:
            time.sleep(0.05)

    def close(self) -> None:
        self._done.set()
        self._thread.join()
        self.sock.close()


@pytest.mark.lab
def test_ready_after_socket_then_watchdog_then_clean_stop(tmp_path):
    daemon = DaemonProcess(tmp_path / "d", env={"WATCHDOG_USEC": str(WATCHDOG_USEC)})
    listener = NotifyListener(tmp_path / "notify.sock", daemon.socket)
    daemon.env["NOTIFY_SOCKET"] = str(listener.path)
    try:
        daemon.start()
        pid = daemon.proc.pid
        listener.wait_for("READY=1", 10)
        time.sleep(3.0)
        code = daemon.stop()
        listener.wait_for("STOPPING=1", 5)
    finally:
        daemon.stop()
        listener.close()
    assert code == 0, daemon.log()
    first = listener.messages[0][1]
    assert "READY=1" in first and f"MAINPID={pid}" in first
    assert listener.accepted_at_ready is True
    ready, stopping = listener.times("READY=1")[0], listener.times("STOPPING=1")
    assert stopping, listener.messages
    pings = [at for at in listener.times("WATCHDOG=1") if ready <= at <= stopping[0]]
    gaps = [b - a for a, b in itertools.pairwise(pings)]
    assert len(pings) >= 5, pings
    assert max(gaps) < WATCHDOG_USEC / 1e6  # systemd would kill the daemon past this
    assert 0.4 <= statistics.mean(gaps) <= 0.7


def unit_capabilities() -> set[str]:
    return set(service_section(UNIT)["CapabilityBoundingSet"].split())


def foreign_group() -> grp.struct_group:
    """A group root is not in: giving the socket to it needs CAP_CHOWN, as group `shift` does."""
    own = {os.getgid(), *os.getgroups()}
    return next(g for g in grp.getgrall() if g.gr_gid not in own)


def start_confined(daemon: DaemonProcess, capabilities: set[str], timeout: float = 20.0) -> None:
    """Start shiftd in its namespace as root with only CAPABILITIES and no_new_privs. That is how
    systemd starts the unit: root's capabilities after exec are the bounding set."""
    bounding = ",".join(["-all", *sorted("+" + c.removeprefix("CAP_").lower() for c in capabilities)])
    cmd = ["ip", "netns", "exec", daemon.netns, "setpriv", "--no-new-privs", f"--bounding-set={bounding}"]
    cmd += [sys.executable, "-m", "shiftd.daemon", "--config", str(daemon.config_path)]
    with open(daemon.log_path, "ab") as log:
        daemon.proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while daemon.proc.poll() is None and not _accepts(daemon.socket) and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.fixture
def daemon(tmp_path) -> DaemonProcess:
    """A shiftd, not started yet, for a namespace of its own with a veth NIC `dp0` (dpa)."""
    with netns("dpcap") as ns:
        ip("-n", ns, "link", "add", "dpa", "type", "veth", "peer", "name", "dpb")
        for dev in ("dpa", "dpb"):
            ip("-n", ns, "link", "set", dev, "up")
        daemon = DaemonProcess(
            tmp_path / "d",
            netns=ns,
            sections={
                "server": {"socket_group": foreign_group().gr_name},
                "metrics": {"listen": ""},
                "devices": {"dp0": "dpa"},
            },
        )
        try:
            yield daemon
        finally:
            daemon.stop()


def link_is_up(ns: str, dev: str) -> bool:
    shown = subprocess.run(["ip", "-n", ns, "-o", "link", "show", dev], capture_output=True, text=True)
    return "UP" in re.search(r"<([^>]*)>", shown.stdout).group(1).split(",")


def tc_filters(ns: str, dev: str) -> str:
    result = subprocess.run(
        ["tc", "-n", ns, "filter", "show", "dev", dev, "ingress"], capture_output=True, text=True
    )
    return result.stdout


@pytest.mark.lab
def test_unit_capabilities_are_enough_for_socket_group_and_faults(daemon):
    ns = daemon.netns
    start_confined(daemon, unit_capabilities())
    assert daemon.proc.poll() is None, daemon.log()
    assert os.stat(daemon.socket).st_gid == foreign_group().gr_gid
    with daemon.channel() as channel:
        admin = daemon.admin(channel)
        admin.FailNic(admin_pb2.FailNicRequest(device="dp0", mode=common_pb2.FAULT_MODE_DOWN), timeout=10)
        assert not link_is_up(ns, "dpa")
        admin.RecoverNic(admin_pb2.RecoverNicRequest(device="dp0"), timeout=10)
        assert link_is_up(ns, "dpa")
        # the black hole runs `tc`, a child that must inherit CAP_NET_ADMIN
        admin.FailNic(
            admin_pb2.FailNicRequest(device="dp0", mode=common_pb2.FAULT_MODE_BLACKHOLE), timeout=10
        )
        assert tc_filters(ns, "dpa").strip()
        admin.RecoverNic(admin_pb2.RecoverNicRequest(device="dp0"), timeout=10)
        assert not tc_filters(ns, "dpa").strip()
    assert daemon.stop() == 0, daemon.log()


@pytest.mark.lab
def test_without_cap_net_admin_faults_fail_cleanly(daemon):
    start_confined(daemon, unit_capabilities() - {"CAP_NET_ADMIN"})
    assert daemon.proc.poll() is None, daemon.log()
    with daemon.channel() as channel, pytest.raises(grpc.RpcError) as failed:
        daemon.admin(channel).FailNic(admin_pb2.FailNicRequest(device="dp0"), timeout=10)
    assert failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert link_is_up(daemon.netns, "dpa")


@pytest.mark.lab
def test_without_cap_chown_the_socket_cannot_get_its_group(daemon):
    start_confined(daemon, unit_capabilities() - {"CAP_CHOWN"})
    assert daemon.proc.wait(10) != 0
    assert "not permitted" in daemon.log().lower()
