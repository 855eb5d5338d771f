"""The lab: hosts as network namespaces, with etcd and one supervised shiftd per host (`Lab`).

`up` builds the fabric (shiftlab.fabric), writes each host's shiftd config, starts etcd (one member,
or a cluster of 3 or 5 on addresses of their own) in the management namespace, a route keeper
(shiftlab.routekeeper: a NIC set up again gets its routes back) and a shiftd in every host namespace,
detached, each under a supervisor (shiftlab.supervise) that restarts it after a
crash as systemd would on a real host, and records them in /run/shift-lab/NAME/state.json. That
record is what lets `status`, `exec` and `down`, run later from any shell, act on exactly the
processes `up` started: by PID checked against the kernel's start time (shiftlab.pids), so a recycled
PID is never signalled. The CLI (shiftlab.cli) and the tests share this class.

With provider "rxe" the hosts' NICs carry Soft-RoCE devices and stay in the initial namespace
(shiftlab.softroce says why), and so do the hosts' processes: each shiftd is told which RDMA devices
are its host's (monitors.rdma_devices).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shiftlab import fabric, netns, softroce
from shiftlab.etcdproc import EtcdProcess
from shiftlab.fabric import Shape
from shiftlab.pids import Pid, stop

RUN_ROOT = Path("/run/shift-lab")
DEFAULT_NAME = "shift"
ETCD_PORT = 2379
ETCD_PEER_PORT = 2380
METRICS_PORT = 9477
SHIFTD_ENV = "SHIFT_LAB_SHIFTD"  # overrides the daemon command, e.g. for a stand-in
READY_TIMEOUT = 20.0
ETCD_READY_TIMEOUT = 15.0  # at least; a slower machine's longer ready_timeout (a VM's) counts for etcd too
STOP_TIMEOUT = 5.0
RESTART_SEC = 0.5  # the supervisor's first restart delay (systemd's RestartSec)
ROUTE_KEEPER = "routekeeper"  # its key in state.json's pids


class LabError(RuntimeError):
    """A lab operation cannot proceed; str() is one line for the operator."""


@dataclass(frozen=True)
class EtcdMember:
    """One member of the lab's etcd cluster and where its files live."""

    key: str  # its entry in state.json's pids: "etcd" (the first), "etcd1", ...
    name: str  # its name in the cluster
    address: str
    data_dir: Path
    log: Path

    @property
    def endpoint(self) -> str:
        return f"{self.address}:{ETCD_PORT}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.address}:{ETCD_PEER_PORT}"


class Lab:
    """One lab: its shape, where its files live, and the processes it started."""

    def __init__(
        self,
        name: str = DEFAULT_NAME,
        hosts: int = 2,
        nics: int = 2,
        *,
        etcd_members: int = 1,
        provider: str = "tcp",
        shiftd_cmd: Sequence[str] | None = None,
        run_root: Path = RUN_ROOT,
        ready_timeout: float = READY_TIMEOUT,
    ) -> None:
        self.shape = Shape(name, hosts, nics, etcd_members, provider)
        self.run_root = Path(run_root)
        self.shiftd_cmd = list(shiftd_cmd) if shiftd_cmd is not None else None
        self.ready_timeout = ready_timeout
        self._pids: dict[str, Pid] = {}

    @classmethod
    def existing(cls, name: str = DEFAULT_NAME, run_root: Path = RUN_ROOT) -> Lab:
        """The lab `up` recorded under `name`, with the shape it was built with."""
        state = _read_json(Path(run_root) / name / "state.json")
        if state is None:
            raise LabError(f"lab {name!r} is not up; start it with: shift-lab up{name_flag(name)}")
        return cls(
            name,
            state["hosts"],
            state["nics"],
            etcd_members=state.get("etcd_members", 1),
            provider=state.get("provider", "tcp"),
            run_root=run_root,
        )

    # names and paths

    @property
    def name(self) -> str:
        return self.shape.name

    @property
    def state_dir(self) -> Path:
        return self.run_root / self.name

    @property
    def state_path(self) -> Path:
        return self.state_dir / "state.json"

    @property
    def host_names(self) -> list[str]:
        return self.shape.host_names

    @property
    def namespaces(self) -> list[str]:
        return self.shape.namespaces

    @property
    def etcd_members(self) -> list[EtcdMember]:
        members = []
        for m in range(self.shape.etcd_members):
            key = "etcd" if m == 0 else f"etcd{m}"
            address = self.shape.etcd_address(m)
            data_dir, log = self.state_dir / key, self.state_dir / f"{key}.log"
            members.append(EtcdMember(key, f"{self.name}-{key}", address, data_dir, log))
        return members

    @property
    def etcd_endpoint(self) -> str:
        """The first member's endpoint (the only one in a one-member lab)."""
        return self.etcd_members[0].endpoint

    @property
    def etcd_endpoints(self) -> list[str]:
        return [member.endpoint for member in self.etcd_members]

    def index(self, host: str) -> int:
        if host not in self.host_names:
            hosts = ", ".join(self.host_names)
            raise LabError(f"no host {host!r} in lab {self.name!r} (hosts: {hosts})")
        return self.host_names.index(host)

    def namespace(self, host: str) -> str | None:
        """The host's network namespace; None when it is the initial one (a lab on rxe)."""
        i = self.index(host)
        return None if self.shape.in_initial_ns else self.shape.host_ns(i)

    @property
    def softroce_record(self) -> Path:
        return self.state_dir / "softroce.json"

    def host_dir(self, host: str) -> Path:
        self.index(host)
        return self.state_dir / host

    def socket(self, host: str) -> Path:
        return self.host_dir(host) / "shiftd.sock"

    def config_path(self, host: str) -> Path:
        return self.host_dir(host) / "shiftd.toml"

    def log_path(self, host: str) -> Path:
        return self.host_dir(host) / "shiftd.log"

    def supervisor_state_path(self, host: str) -> Path:
        return self.host_dir(host) / "supervisor.json"

    def daemon(self, host: str) -> Pid | None:
        """The shiftd that the host's supervisor runs now (it changes with every restart), if alive."""
        state = _read_json(self.supervisor_state_path(host))
        if not state or state.get("pid") is None or state.get("start") is None:
            return None
        pid = Pid(state["pid"], state["start"])
        return pid if pid.alive() else None

    def daemon_ready(self, host: str) -> bool:
        """Whether the host's shiftd serves now (it said READY=1 to its supervisor)."""
        return bool((_read_json(self.supervisor_state_path(host)) or {}).get("ready"))

    def restarts(self, host: str) -> int:
        """How often the supervisor has restarted the host's shiftd."""
        state = _read_json(self.supervisor_state_path(host))
        return int(state["restarts"]) if state else 0

    def restart_daemon(self, host: str) -> None:
        """`systemctl restart shiftd` on `host`: its supervisor stops the daemon (SIGTERM, a clean stop)
        and starts a new one at once, on the socket it holds."""
        supervisor = self._pids.get(host) or _pids_from(_read_json(self.state_path)).get(host)
        if supervisor is None or not supervisor.alive():
            raise LabError(f"no supervisor runs shiftd on {host}; run: shift-lab up{name_flag(self.name)}")
        os.kill(supervisor.pid, signal.SIGUSR1)

    @property
    def sockets(self) -> dict[str, Path]:
        return {h: self.socket(h) for h in self.host_names}

    def host_env(self, host: str) -> dict[str, str]:
        """The environment of a host's processes: its socket and config, and this venv's tools.

        A device table of the caller (SHIFT_TCP_DEVICES) is dropped: on a lab host the devices are
        the host's own, from its config.
        """
        inherited = {k: v for k, v in os.environ.items() if k != "SHIFT_TCP_DEVICES"}
        return {
            **inherited,
            "PATH": _tool_path(),
            "SHIFT_HOST": host,
            "SHIFT_SOCKET": str(self.socket(host)),
            "SHIFT_CONFIG": str(self.config_path(host)),
        }

    def config_text(self, host: str) -> str:
        """The shiftd config of `host` (schema: shiftd/config.py)."""
        i = self.index(host)
        if self.shape.in_initial_ns:  # rxe devices are found in sysfs; the host's are named
            own = json.dumps(list(self.shape.host_devices(i)))
            devices = f"[monitors]\nrdma_devices = {own}\n"
        else:
            table = "\n".join(f'{dev} = "{netdev}"' for dev, netdev in self.shape.devices().items())
            devices = f"[devices]\n{table}\n"
        return (
            f"# written by shift-lab for lab {self.name!r}; rewritten by every `shift-lab up`\n"
            f'host = "{host}"\n\n'
            f'[server]\nsocket = "{self.socket(host)}"\n\n'
            f"[etcd]\nendpoints = {json.dumps(self.etcd_endpoints)}\n\n"
            f'[metrics]\nlisten = "{self.shape.mgmt_address(i)}:{METRICS_PORT}"\n\n'
            "[health]\nhold_down_seconds = 1.0\n\n"
            # the defaults' thresholds on a lab's time scale: a few bounces within seconds are damped
            "[damping]\nhalf_life_seconds = 1.0\nmax_suppress_seconds = 8.0\n\n"
            # a NIC found losing its traffic, or slow, is tried again after 5 s, not 30
            "[loss]\nhold_seconds = 5.0\n\n"
            "[slow]\nhold_seconds = 5.0\n\n"
            f"{devices}"
        )

    # operations

    def up(self) -> None:
        """Build what is missing and start what is not running; on failure remove all but the logs."""
        require_root()
        if self.shape.provider == "rxe":
            softroce.require()
        with self._locked():
            self._load_pids()
            self._check_shape()
            try:
                fabric.build(self.shape)
                self.state_dir.mkdir(parents=True, exist_ok=True)
                if self.shape.provider == "rxe":
                    softroce.build(self.shape, self.softroce_record)
                for host in self.host_names:
                    self.host_dir(host).mkdir(parents=True, exist_ok=True)
                    self.config_path(host).write_text(self.config_text(host))
                self._save()
                self._ensure_etcd()
                self._ensure_route_keeper()
                self._ensure_daemons()
            except BaseException:
                self._teardown(keep_logs=True)
                raise

    def down(self) -> list[str]:
        """Stop the lab's processes, delete its namespaces and links and its state; says what it did."""
        require_root()
        with self._locked():
            try:
                self._load_pids()
            except LabError as exc:  # down is the way out of a corrupt lab, so it must not stop here
                return [f"warning: {exc}; its processes were not stopped", *self._teardown(keep_logs=False)]
            return self._teardown(keep_logs=False)

    def status(self) -> dict[str, Any]:
        """Shape, namespaces present, each process alive or dead, sockets and addresses."""
        state = _read_json(self.state_path)
        pids = _pids_from(state)
        present = fabric.present(self.name)
        namespaces = {ns: ns in present for ns in sorted({*self.namespaces, *present})}
        members = [{**self._member_record(m), **_process_status(pids.get(m.key))} for m in self.etcd_members]
        etcd = {
            "endpoint": self.etcd_endpoint,
            "endpoints": self.etcd_endpoints,
            "namespace": self.shape.mgmt_ns,
            "alive": all(m["alive"] for m in members),
            "members": members,
        }
        hosts = {h: self._host_status(h, pids.get(h)) for h in self.host_names}
        processes = [etcd, *hosts.values()]
        keeper = {"route_keeper": _process_status(pids.get(ROUTE_KEEPER))}
        processes += keeper.values()
        return {
            "name": self.name,
            "up": state is not None,
            "healthy": state is not None and all(namespaces.values()) and all(p["alive"] for p in processes),
            "shape": {
                "hosts": self.shape.hosts,
                "nics": self.shape.nics,
                "etcd_members": self.shape.etcd_members,
                "provider": self.shape.provider,
            },
            "state_dir": str(self.state_dir),
            "namespaces": namespaces,
            "etcd": etcd,
            "hosts": hosts,
            **keeper,
        }

    def exec_command(self, host: str, argv: Sequence[str]) -> tuple[list[str], dict[str, str]]:
        """argv and environment that run `argv` inside `host`'s namespace, aimed at its shiftd."""
        ns = self.namespace(host)
        if not argv:
            raise LabError(
                f"nothing to run: give a command after --, e.g. shift-lab exec {host} -- shiftctl nics"
            )
        if ns is not None and not netns.exists(ns):
            raise LabError(f"namespace {ns} is missing; run: shift-lab up{name_flag(self.name)}")
        return self._on_host(host, argv), self.host_env(host)

    # internals

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Serialise up/down of all labs on this machine (two `up`s must not race on one fabric)."""
        self.run_root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.run_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _load_pids(self) -> None:
        self._pids = _pids_from(_read_json(self.state_path))

    def _check_shape(self) -> None:
        state = _read_json(self.state_path)
        down = f"shift-lab down{name_flag(self.name)}"
        shape = (self.shape.hosts, self.shape.nics, self.shape.etcd_members, self.shape.provider)
        if state and _shape_of(state) != shape:
            raise LabError(
                f"lab {self.name!r} is up with {state['hosts']} hosts x {state['nics']} NICs"
                f" and {_members(state.get('etcd_members', 1))} on provider {state.get('provider', 'tcp')};"
                f" run `{down}` first to change its shape"
            )
        if self.shape.provider == "rxe":
            others = [
                p.parent.name for p in self.run_root.glob("*/softroce.json") if p.parent.name != self.name
            ]
            if others:
                raise LabError(
                    f"lab {others[0]!r} runs on rxe already, and the initial namespace that holds its NICs"
                    f" takes one such lab; run `shift-lab down{name_flag(others[0])}` first"
                )
        stray = sorted(set(fabric.present(self.name)) - set(self.namespaces))
        if stray:
            raise LabError(
                f"lab {self.name!r} has namespaces of another shape ({', '.join(stray)}); run `{down}`"
            )

    def _save(self) -> None:
        state = {
            "name": self.name,
            "hosts": self.shape.hosts,
            "nics": self.shape.nics,
            "etcd_members": self.shape.etcd_members,
            "provider": self.shape.provider,
            "pids": {key: {"pid": p.pid, "start": p.start} for key, p in self._pids.items()},
            "etcd": {
                "endpoints": self.etcd_endpoints,
                "namespace": self.shape.mgmt_ns,
                "members": [self._member_record(m) for m in self.etcd_members],
            },
            "shiftd": {h: self._host_record(h) for h in self.host_names},
        }
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        os.replace(tmp, self.state_path)

    def _host_record(self, host: str) -> dict[str, Any]:
        i = self.index(host)
        return {
            "namespace": self.namespace(host),
            "socket": str(self.socket(host)),
            "config": str(self.config_path(host)),
            "log": str(self.log_path(host)),
            "metrics": f"{self.shape.mgmt_address(i)}:{METRICS_PORT}",
            "devices": self.shape.host_devices(i),
            "mgmt_netdev": self.shape.mgmt_netdev(i),
            "addresses": self.shape.host_addresses(i),
        }

    @staticmethod
    def _member_record(member: EtcdMember) -> dict[str, Any]:
        return {"name": member.name, "endpoint": member.endpoint, "log": str(member.log)}

    def _host_status(self, host: str, supervisor: Pid | None) -> dict[str, Any]:
        """The daemon counts as alive when its supervisor is, and has a shiftd running right now."""
        daemon = self.daemon(host) if supervisor and supervisor.alive() else None
        return {
            **self._host_record(host),
            "pid": daemon.pid if daemon else None,
            "alive": daemon is not None,
            "supervisor": _process_status(supervisor),
            "restarts": self.restarts(host),
        }

    def _ensure_etcd(self) -> None:
        """Start the members that are not running, all at once: a new cluster needs a quorum to be ready."""
        cluster = ",".join(f"{m.name}={m.peer_url}" for m in self.etcd_members)
        dead = [m for m in self.etcd_members if not (self._pids.get(m.key) and self._pids[m.key].alive())]
        processes = {
            m.key: EtcdProcess(
                data_dir=m.data_dir,
                name=m.name,
                client_host=m.address,
                client_port=ETCD_PORT,
                peer_port=ETCD_PEER_PORT,
                netns=self.shape.mgmt_ns,
                log_path=m.log,
                initial_cluster=cluster,
            )
            for m in dead
        }
        with ThreadPoolExecutor(max_workers=max(1, len(processes))) as pool:
            started = {
                key: pool.submit(p.start, max(ETCD_READY_TIMEOUT, self.ready_timeout))
                for key, p in processes.items()
            }
        for key, process in processes.items():
            if process.proc is not None:
                self._pids[key] = Pid.of(process.proc.pid)
        self._save()
        for future in started.values():
            future.result()  # the first member's failure, if any, is the one reported

    def _ensure_daemons(self) -> None:
        started: dict[str, subprocess.Popen[bytes]] = {}
        for host in self.host_names:
            pid = self._pids.get(host)
            if pid is None or not pid.alive():
                started[host] = self._spawn_shiftd(host)
                self._pids[host] = Pid.of(started[host].pid)
                self._save()
        for host, proc in started.items():
            self._wait_ready(host, proc)

    def _ensure_route_keeper(self) -> None:
        pid = self._pids.get(ROUTE_KEEPER)
        if pid is not None and pid.alive():
            return
        shape = self.shape
        argv = [
            *[sys.executable, "-m", "shiftlab.routekeeper"],
            *[shape.name, str(shape.hosts), str(shape.nics), shape.provider],
        ]
        with open(self.state_dir / f"{ROUTE_KEEPER}.log", "ab") as log:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
            )
        self._pids[ROUTE_KEEPER] = Pid.of(proc.pid)
        self._save()

    def _on_host(self, host: str, argv: Sequence[str]) -> list[str]:
        """argv run on `host`: inside its namespace, or as it is where hosts share the initial one."""
        ns = self.namespace(host)
        return list(argv) if ns is None else netns.command(ns, argv)

    def _shiftd_argv(self) -> list[str]:
        if self.shiftd_cmd is not None:
            cmd = self.shiftd_cmd
        elif os.environ.get(SHIFTD_ENV):
            cmd = shlex.split(os.environ[SHIFTD_ENV])
        else:
            cmd = ["shiftd"]
        exe = shutil.which(cmd[0], path=_tool_path()) if cmd else None
        if exe is None:
            raise LabError(f"shiftd command not found: {shlex.join(cmd)!r} (set {SHIFTD_ENV} to override)")
        return [exe, *cmd[1:]]

    def _spawn_shiftd(self, host: str) -> subprocess.Popen[bytes]:
        """The host's supervisor, in the host's namespace, running shiftd as its child."""
        self.supervisor_state_path(host).unlink(missing_ok=True)  # a dead supervisor's record
        supervise = [
            sys.executable, "-m", "shiftlab.supervise",
            "--state", str(self.supervisor_state_path(host)),
            "--restart-sec", str(RESTART_SEC),
            "--stop-timeout", str(STOP_TIMEOUT - 1),
            "--listen", str(self.socket(host)),  # held across the daemon's restarts, as shiftd.socket is
            "--", *self._shiftd_argv(), "--config", str(self.config_path(host)),
        ]  # fmt: skip
        argv = self._on_host(host, supervise)
        with open(self.log_path(host), "ab") as log:
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=self.host_env(host),
                start_new_session=True,
            )

    def _wait_ready(self, host: str, proc: subprocess.Popen[bytes]) -> None:
        """Wait until the daemon serves on its socket (READY=1, heard by its supervisor), pointing at its
        log when it does not. The socket itself accepts from the start: the supervisor holds it."""
        path, log = self.socket(host), self.log_path(host)
        deadline = time.monotonic() + self.ready_timeout
        while not self.daemon_ready(host):
            if proc.poll() is not None:
                raise LabError(f"shiftd on {host} exited with status {proc.returncode}; see {log}")
            if time.monotonic() > deadline:
                raise LabError(
                    f"shiftd on {host} did not accept connections on {path} within {self.ready_timeout:g}s;"
                    f" see {log}"
                )
            time.sleep(0.05)

    def _teardown(self, keep_logs: bool) -> list[str]:
        done = []
        daemons = [(k, p) for k, p in self._pids.items() if not k.startswith("etcd")]
        etcd = [(k, p) for k, p in self._pids.items() if k.startswith("etcd")]
        for group in (daemons, etcd):  # daemons first: they still talk to etcd while stopping
            live = [(k, p) for k, p in group if p.alive()]
            stop([p for _, p in live], STOP_TIMEOUT)
            done += [f"stopped {_what(k)} (pid {p.pid})" for k, p in live]
        self._pids = {}
        done += softroce.destroy(
            self.softroce_record
        )  # before the fabric: it deletes the rxe devices' netdevs
        done += [f"removed namespace {ns}" for ns in fabric.destroy(self.name)]
        if self.state_dir.exists():
            _discard(self.state_dir, keep_logs)
            done.append(
                f"removed {self.state_dir}" if not keep_logs else f"kept the logs in {self.state_dir}"
            )
        return done


def _what(key: str) -> str:
    if key == ROUTE_KEEPER:
        return "the route keeper"
    return key if key.startswith("etcd") else f"shiftd and its supervisor on {key}"


def _shape_of(state: dict[str, Any]) -> tuple[int, int, int, str]:
    return state["hosts"], state["nics"], state.get("etcd_members", 1), state.get("provider", "tcp")


def _members(count: int) -> str:
    return f"{count} etcd member{'s' if count != 1 else ''}"


def _process_status(pid: Pid | None) -> dict[str, Any]:
    return {"pid": pid.pid if pid else None, "alive": bool(pid and pid.alive())}


def _pids_from(state: dict[str, Any] | None) -> dict[str, Pid]:
    if not state:
        return {}
    return {key: Pid(rec["pid"], rec["start"]) for key, rec in state.get("pids", {}).items()}


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as exc:
        raise LabError(f"{path}: unreadable ({exc})") from None


def _discard(state_dir: Path, keep_logs: bool) -> None:
    """Remove the state directory, or everything in it but the logs (a failed `up` points at them)."""
    if not keep_logs:
        shutil.rmtree(state_dir, ignore_errors=True)
        return
    for path in sorted(state_dir.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.is_dir():
            with contextlib.suppress(OSError):
                path.rmdir()  # only when empty: it may hold a log
        elif path.suffix != ".log":
            path.unlink(missing_ok=True)


def _tool_path() -> str:
    """PATH with this interpreter's bin first, so shiftd and shiftctl of this venv are found."""
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)])


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("must run as root: network namespaces need CAP_NET_ADMIN and CAP_SYS_ADMIN (try sudo)")


def name_flag(name: str) -> str:
    return "" if name == DEFAULT_NAME else f" --name {name}"
