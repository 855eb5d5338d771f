"""`shift-lab` end to end: real namespaces, a real etcd, and a stand-in daemon per host.

The stand-in takes shiftd's place (through SHIFT_LAB_SHIFTD or `Lab(shiftd_cmd=...)`): it reads
the generated config, listens on the configured socket and records its namespace, session and
environment, which is everything the lab promises a daemon. Lab names start with `lbc`.
"""

from __future__ import annotations

import itertools
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyroute2 import IPRoute

from shiftd import config
from shiftlab import fabric, netns, spine
from shiftlab.lab import RUN_ROOT, SHIFTD_ENV, Lab, LabError

pytestmark = pytest.mark.lab

# the module behind the `shift-lab` script (test_entry_points checks the script names it): this runs the
# tree under test, even where the installed script is older
SHIFT_LAB = [sys.executable, "-m", "shiftlab.cli"]
_labs = itertools.count()

STANDIN = r'''
"""A stand-in for shiftd: listens on the configured socket, says READY=1 as shiftd does, records where
it runs. --exit-after-ready N: exit with status N a second after READY (0: cleanly, as after SIGTERM).
"""
import json, os, signal, socket, sys, time, tomllib

with open(sys.argv[sys.argv.index("--config") + 1], "rb") as f:
    path = tomllib.load(f)["server"]["socket"]
if "--ignore-term" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
env = {k: os.environ.get(k) for k in ("SHIFT_HOST", "SHIFT_SOCKET", "SHIFT_CONFIG")}
info = {"pid": os.getpid(), "sid": os.getsid(0), "netns": os.stat("/proc/self/ns/net").st_ino, "env": env}
with open(path + ".json", "w") as f:
    json.dump(info, f)
if os.path.exists(path):
    os.unlink(path)
server = socket.socket(socket.AF_UNIX)
server.bind(path)
server.listen()
notify = os.environ.get("NOTIFY_SOCKET", "")
if notify:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(b"READY=1", "\0" + notify[1:] if notify.startswith("@") else notify)
if "--exit-after-ready" in sys.argv:
    time.sleep(1.0)
    sys.exit(int(sys.argv[sys.argv.index("--exit-after-ready") + 1]))
while True:
    server.accept()[0].close()
'''


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    path = tmp_path_factory.mktemp("standin") / "standin.py"
    path.write_text(STANDIN)
    return [sys.executable, str(path)]


def new_name() -> str:
    return f"lbc{os.getpid()}x{next(_labs)}"


def cli(*args: str, standin: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ETCDCTL_API": "3"}
    if standin:
        env[SHIFTD_ENV] = shlex.join(standin)
    return subprocess.run(
        [*SHIFT_LAB, *args], capture_output=True, text=True, env=env, timeout=90, check=False
    )


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """The result failed with exactly one line on stderr, which is returned."""
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("shift-lab: ")
    return lines[0]


def standin_info(lab: Lab, host: str) -> dict[str, Any]:
    return json.loads(Path(f"{lab.socket(host)}.json").read_text())


def state(lab: Lab) -> dict[str, Any]:
    return json.loads(lab.state_path.read_text())


def pid_alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def root_links() -> set[str]:
    with IPRoute() as ipr:
        return {link.get("ifname") for link in ipr.get_links()}


@pytest.fixture
def lab_name() -> Iterator[str]:
    name = new_name()
    try:
        yield name
    finally:
        Lab(name).down()


@pytest.fixture(scope="module")
def running(standin: list[str]) -> Iterator[Lab]:
    """One 2x2 lab brought up through the CLI, shared by the tests that only look at it."""
    name = new_name()
    before = root_links()
    result = cli("up", "--name", name, standin=standin)
    try:
        assert result.returncode == 0, result.stderr
        yield Lab.existing(name)
    finally:
        Lab(name).down()
    assert root_links() == before


def test_state_records_shape_processes_sockets_and_addresses(running: Lab) -> None:
    recorded = state(running)
    assert (recorded["hosts"], recorded["nics"]) == (2, 2)
    assert set(recorded["pids"]) == {"etcd", "routekeeper", "h0", "h1"}
    assert all(pid_alive(p["pid"]) for p in recorded["pids"].values())
    h1 = recorded["shiftd"]["h1"]
    assert h1["socket"] == f"/run/shift-lab/{running.name}/h1/shiftd.sock"
    assert h1["addresses"] == {
        "ens1f0np0": "198.18.0.11/24",
        "ens2f0np0": "198.18.1.11/24",
        "mgmt0": "198.19.0.11/24",
    }
    assert h1["devices"] == {"mlx5_0": "ens1f0np0", "mlx5_1": "ens2f0np0"}
    assert (RUN_ROOT / running.name / "etcd.log").exists()


def test_daemons_run_detached_in_their_host_namespace_with_their_config(running: Lab) -> None:
    for host in running.host_names:
        info = standin_info(running, host)
        assert info["netns"] == os.stat(netns.path(running.namespace(host))).st_ino
        supervisor = state(running)["pids"][host]["pid"]
        assert info["sid"] == supervisor != os.getsid(0), "a daemon's supervisor leads its own session"
        daemon = running.daemon(host)
        assert daemon is not None and info["pid"] == daemon.pid != supervisor
        assert info["env"] == {
            "SHIFT_HOST": host,
            "SHIFT_SOCKET": str(running.socket(host)),
            "SHIFT_CONFIG": str(running.config_path(host)),
        }


def test_generated_configs_load_in_shiftd(running: Lab) -> None:
    for i, host in enumerate(running.host_names):
        cfg = config.load(running.config_path(host))
        assert cfg.host == host
        assert cfg.server.socket == f"/run/shift-lab/{running.name}/{host}/shiftd.sock"
        assert cfg.etcd.endpoints == ("198.19.0.1:2379",)
        assert cfg.metrics.listen == f"198.19.0.{10 + i}:9477"
        assert cfg.health.hold_down_seconds == 1.0
        assert (cfg.damping.half_life_seconds, cfg.damping.max_suppress_seconds) == (1.0, 8.0)
        assert cfg.devices == {"mlx5_0": "ens1f0np0", "mlx5_1": "ens2f0np0"}


def test_status_json_reports_a_healthy_lab(running: Lab) -> None:
    result = cli("status", "--json", "--name", running.name)
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["up"] and status["healthy"]
    assert status["shape"] == {"hosts": 2, "nics": 2, "etcd_members": 1, "provider": "tcp"}
    assert status["namespaces"] == {ns: True for ns in running.namespaces}
    assert status["etcd"]["alive"] and status["etcd"]["endpoint"] == "198.19.0.1:2379"
    assert status["hosts"]["h0"]["alive"] and status["hosts"]["h1"]["alive"]
    assert status["hosts"]["h0"]["socket"] == str(running.socket("h0"))
    assert status["hosts"]["h0"]["addresses"]["ens2f0np0"] == "198.18.1.10/24"

    text = cli("status", "--name", running.name)
    assert (
        text.returncode == 0 and "healthy" in text.stdout and "mlx5_1=ens2f0np0 198.18.1.11/24" in text.stdout
    )


def test_exec_runs_in_the_host_namespace_and_passes_the_exit_code(running: Lab) -> None:
    script = 'echo "$SHIFT_HOST $SHIFT_SOCKET $SHIFT_CONFIG"; ip -o -4 addr show dev ens2f0np0; exit 7'
    result = cli("exec", "--name", running.name, "h1", "--", "sh", "-c", script)
    assert result.returncode == 7, result.stderr
    first, second = result.stdout.splitlines()[:2]
    assert first == f"h1 {running.socket('h1')} {running.config_path('h1')}"
    assert "198.18.1.11/24" in second


def test_the_route_keeper_gives_a_nic_set_up_again_its_route_to_the_spine(running: Lab) -> None:
    ns, netdev = running.namespace("h1"), "ens2f0np0"
    netdevs = {r: running.shape.netdev(r) for r in range(running.shape.nics)}
    with IPRoute(netns=ns, flags=0) as ipr:
        index = ipr.link_lookup(ifname=netdev)[0]
        ipr.link("set", index=index, state="down")
        assert spine.missing(ipr, netdevs) == []  # down: nothing to put back yet
        ipr.link("set", index=index, state="up")
        deadline = time.monotonic() + 5.0
        while spine.missing(ipr, netdevs) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert spine.missing(ipr, netdevs) == []
    fabric.wait_operational(ns, netdev)
    assert fabric.ping(ns, running.shape.rail_address(0, 0), device=netdev, timeout=2.0)  # across the rails
    assert "restored the routes of h1/ens2f0np0" in (running.state_dir / "routekeeper.log").read_text()


def test_hosts_reach_etcd_over_the_management_network(running: Lab) -> None:
    endpoint = running.etcd_endpoint
    put = cli(
        "exec", "--name", running.name, "h0", "--", "etcdctl", "--endpoints", endpoint, "put", "/lb/k", "v"
    )
    assert put.returncode == 0, put.stderr
    get = cli("exec", "--name", running.name, "h1", "--", "etcdctl", "--endpoints", endpoint, "get", "/lb/k")
    assert get.returncode == 0 and get.stdout.split() == ["/lb/k", "v"]


def test_up_again_reuses_a_lab_of_the_same_shape(running: Lab, standin: list[str]) -> None:
    pids = state(running)["pids"]
    result = cli("up", "--name", running.name, standin=standin)
    assert result.returncode == 0, result.stderr
    assert state(running)["pids"] == pids
    # and says how to reach the lab
    assert f"shift-lab exec --name {running.name} h0 -- shiftctl nics" in result.stdout
    assert "198.19.0.1:2379" in result.stdout
    assert str(running.socket("h0")) in result.stdout and str(running.socket("h1")) in result.stdout


def test_up_with_another_shape_is_refused(running: Lab, standin: list[str]) -> None:
    pids = state(running)["pids"]
    line = one_line_error(cli("up", "--name", running.name, "--hosts", "3", standin=standin))
    assert (
        "is up with 2 hosts x 2 NICs" in line and f"run `shift-lab down --name {running.name}` first" in line
    )
    assert state(running)["pids"] == pids and all(pid_alive(p["pid"]) for p in pids.values())


def test_exec_errors_are_one_line(running: Lab) -> None:
    line = one_line_error(cli("exec", "--name", running.name, "h9", "--", "true"))
    assert line == f"shift-lab: no host 'h9' in lab '{running.name}' (hosts: h0, h1)"
    line = one_line_error(cli("exec", "--name", running.name, "h0"))
    assert "nothing to run" in line
    line = one_line_error(cli("exec", "--name", "lbcnosuch", "h0", "--", "true"))
    assert line == "shift-lab: lab 'lbcnosuch' is not up; start it with: shift-lab up --name lbcnosuch"


def test_up_restarts_only_dead_processes(lab_name: str, standin: list[str]) -> None:
    lab = Lab(lab_name, hosts=2, nics=1, shiftd_cmd=standin)
    lab.up()
    pids = state(lab)["pids"]
    os.kill(pids["h1"]["pid"], signal.SIGKILL)  # a process this test's lab started
    deadline = time.monotonic() + 5
    while pid_alive(pids["h1"]["pid"]) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not Lab.existing(lab_name).status()["healthy"]
    assert cli("status", "--name", lab_name).returncode == 1

    lab.up()
    after = state(lab)["pids"]
    assert after["h0"] == pids["h0"] and after["etcd"] == pids["etcd"]
    assert after["h1"] != pids["h1"] and pid_alive(after["h1"]["pid"])
    assert lab.status()["healthy"]


def test_down_removes_everything_and_is_safe_twice(lab_name: str, standin: list[str]) -> None:
    name = lab_name
    before = root_links()
    assert cli("up", "--name", name, "--hosts", "2", "--nics", "1", standin=standin).returncode == 0
    pids = [p["pid"] for p in state(Lab.existing(name))["pids"].values()]

    result = cli("down", "--name", name)
    assert result.returncode == 0, result.stderr
    assert "stopped etcd" in result.stdout and f"removed namespace {name}-h0" in result.stdout
    assert not any(pid_alive(pid) for pid in pids)
    assert fabric.present(name) == []
    assert not (RUN_ROOT / name).exists()
    assert root_links() == before

    again = cli("down", "--name", name)
    assert again.returncode == 0 and "nothing to do" in again.stdout


def test_down_kills_a_daemon_that_ignores_sigterm(
    lab_name: str, standin: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("shiftlab.lab.STOP_TIMEOUT", 0.5)
    lab = Lab(lab_name, hosts=1, nics=1, shiftd_cmd=[*standin, "--ignore-term"])
    lab.up()
    supervisor, daemon = state(lab)["pids"]["h0"]["pid"], lab.daemon("h0")
    assert daemon is not None
    lab.down()
    assert not pid_alive(supervisor) and not pid_alive(daemon.pid)


def test_a_failed_up_cleans_up_and_keeps_the_log(lab_name: str) -> None:
    name = lab_name
    before = root_links()
    crash = [sys.executable, "-c", "import sys; sys.exit('boom: no such device')"]
    line = one_line_error(cli("up", "--name", name, standin=crash))
    log = RUN_ROOT / name / "h0" / "shiftd.log"
    assert line == f"shift-lab: shiftd on h0 exited with status 1; see {log}"
    assert "boom: no such device" in log.read_text()
    assert fabric.present(name) == []
    assert not (RUN_ROOT / name / "state.json").exists()
    assert root_links() == before
    assert cli("status", "--name", name).returncode == 1

    assert cli("down", "--name", name).returncode == 0
    assert not (RUN_ROOT / name).exists()


def test_a_daemon_that_never_listens_times_out(lab_name: str) -> None:
    lab = Lab(lab_name, hosts=1, nics=1, shiftd_cmd=[sys.executable, "-c", "import time; time.sleep(60)"])
    lab.ready_timeout = 1.0
    with pytest.raises(
        LabError, match=r"shiftd on h0 did not accept connections on .*shiftd.sock within 1s; see"
    ):
        lab.up()
    assert fabric.present(lab_name) == []


def test_an_rxe_lab_config_names_the_hosts_own_rxe_devices() -> None:
    lab = Lab("cfg", hosts=3, nics=2, provider="rxe")
    for i, host in enumerate(lab.host_names):
        cfg = config.parse(tomllib.loads(lab.config_text(host)))
        assert cfg.monitors.rdma_devices == (f"h{i}_rxe0", f"h{i}_rxe1")
        assert cfg.devices == {}  # no tcp devices: the NICs are RDMA devices
    assert lab.shape.host_devices(2) == {"h2_rxe0": "h2-ens1f0np0", "h2_rxe1": "h2-ens2f0np0"}
    assert lab.namespace("h1") is None  # rxe sends only from the initial namespace (shiftlab.softroce)
    assert lab.namespaces == ["cfg-rail0", "cfg-rail1", "cfg-mgmt"]


def test_rxe_without_the_rdma_tool_is_one_line(lab_name: str, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"  # the tools the lab needs, but not rdma(8)
    bin_dir.mkdir()
    for tool in ("ip", "modprobe"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    result = subprocess.run(
        [*SHIFT_LAB, "up", "--name", lab_name, "--provider", "rxe"],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": str(bin_dir)},
        timeout=90,
    )
    line = one_line_error(result)
    assert line == (
        "shift-lab: --provider rxe needs the rdma tool, which is not installed (apt-get install iproute2)"
    )
    assert fabric.present(lab_name) == []


def test_rxe_on_a_kernel_without_rdma_rxe_is_one_line(lab_name: str) -> None:
    if subprocess.run(["modprobe", "--dry-run", "--quiet", "rdma_rxe"]).returncode == 0:
        pytest.skip("this kernel has rdma_rxe: tests/shiftlab/test_lab_rxe.py runs the rxe lab on it")
    before = root_links()
    line = one_line_error(cli("up", "--name", lab_name, "--provider", "rxe"))
    assert line.startswith("shift-lab: --provider rxe: this kernel cannot load rdma_rxe (")
    assert line.endswith("); use --provider tcp")
    assert fabric.present(lab_name) == []
    assert root_links() == before


def test_a_missing_daemon_command_is_one_line(lab_name: str) -> None:
    line = one_line_error(cli("up", "--name", lab_name, standin=["/nonexistent/shiftd"]))
    assert (
        line == f"shift-lab: shiftd command not found: '/nonexistent/shiftd' (set {SHIFTD_ENV} to override)"
    )
    assert fabric.present(lab_name) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["up", "--hosts", "0", "--name", "lbcbad"], "shift-lab: --hosts must be between 1 and 64, not 0"),
        (["up", "--nics", "9", "--name", "lbcbad"], "shift-lab: --nics must be between 1 and 8, not 9"),
        (["up", "--name", "a b"], "shift-lab: lab name 'a b': use 1-32 letters"),
        (["status", "--name", "lbcnosuch"], None),
    ],
)
def test_bad_input_gives_one_line(args: list[str], message: str | None) -> None:
    result = cli(*args)
    if message is None:  # status of a lab that is not up: a plain answer, exit 1
        assert result.returncode == 1 and result.stdout.strip() == "lab 'lbcnosuch' is not up"
        return
    assert one_line_error(result).startswith(message)
    assert fabric.present("lbcbad") == []


def test_up_without_root_is_one_line() -> None:
    """Imports happen as root (the interpreter lives under /root); main() then runs as nobody."""
    code = (
        "import os, sys; from shiftlab import cli; "
        "os.setgroups([]); os.setresgid(65534, 65534, 65534); os.setresuid(65534, 65534, 65534); "
        "sys.exit(cli.main(['up', '--name', 'lbcnoroot']))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "shift-lab: must run as root: network namespaces need CAP_NET_ADMIN and CAP_SYS_ADMIN (try sudo)"
    )
    assert fabric.present("lbcnoroot") == []


@pytest.mark.parametrize(
    ("subcommand", "words"),
    [
        ("up", ["--hosts", "--nics", "--name", "mlx5_0", "198.19.0.1:2379", SHIFTD_ENV]),
        ("down", ["SIGKILL", "namespace", "failed `up`"]),
        ("status", ["--json", "alive", "Exits 0"]),
        ("exec", ["SHIFT_SOCKET", "SHIFT_CONFIG", "SHIFT_HOST", "shift-lab exec h0 -- shiftctl nics"]),
    ],
)
def test_help_explains_each_subcommand(subcommand: str, words: list[str]) -> None:
    result = cli(subcommand, "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    for word in words:
        assert word in text


def test_a_corrupt_state_file_is_one_line_and_down_still_cleans_up(lab_name: str) -> None:
    state_dir = RUN_ROOT / lab_name
    state_dir.mkdir(parents=True)
    (state_dir / "state.json").write_text("{not json")
    line = one_line_error(cli("status", "--name", lab_name))
    assert line.startswith(f"shift-lab: {state_dir}/state.json: unreadable")
    down = cli("down", "--name", lab_name)
    assert down.returncode == 0 and "state.json: unreadable" in down.stdout
    assert not state_dir.exists()


def wait_for(predicate: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


def _recorded_pid(lab: Lab, host: str) -> int | None:
    try:
        return standin_info(lab, host)["pid"]
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def test_three_etcd_members_each_on_its_own_address(lab_name: str, standin: list[str]) -> None:
    result = cli(
        "up", "--name", lab_name, "--hosts", "1", "--nics", "1", "--etcd-members", "3", standin=standin
    )
    assert result.returncode == 0, result.stderr
    assert "198.19.0.1:2379, 198.19.0.2:2379, 198.19.0.3:2379" in result.stdout
    lab = Lab.existing(lab_name)
    endpoints = ["198.19.0.1:2379", "198.19.0.2:2379", "198.19.0.3:2379"]
    assert config.load(lab.config_path("h0")).etcd.endpoints == tuple(endpoints)
    status = json.loads(cli("status", "--json", "--name", lab_name).stdout)
    assert status["healthy"] and status["shape"]["etcd_members"] == 3
    members = status["etcd"]["members"]
    assert [m["endpoint"] for m in members] == endpoints and all(m["alive"] for m in members)
    assert len({m["pid"] for m in members}) == 3
    text = cli("status", "--name", lab_name).stdout
    assert f"etcd   198.19.0.3:2379 ({lab_name}-etcd2): pid {members[2]['pid']} alive" in text
    # one cluster of three, reachable from a host on every member's address
    listing = cli(
        "exec", "--name", lab_name, "h0", "--", "etcdctl", "--endpoints", endpoints[2], "member", "list"
    )
    assert listing.returncode == 0, listing.stderr
    assert sorted(line.split(", ")[2] for line in listing.stdout.splitlines()) == [
        f"{lab_name}-etcd",
        f"{lab_name}-etcd1",
        f"{lab_name}-etcd2",
    ]
    # another member count is another shape
    line = one_line_error(cli("up", "--name", lab_name, "--hosts", "1", "--nics", "1", standin=standin))
    assert "is up with 1 hosts x 1 NICs and 3 etcd members" in line

    down = cli("down", "--name", lab_name)
    assert down.returncode == 0 and "stopped etcd2" in down.stdout
    assert not any(pid_alive(m["pid"]) for m in members)


def test_an_even_etcd_cluster_is_refused() -> None:
    line = one_line_error(cli("up", "--name", "lbcbad", "--etcd-members", "2"))
    assert line == "shift-lab: --etcd-members must be one of 1, 3, 5, not 2"
    assert fabric.present("lbcbad") == []


def test_the_supervisor_restarts_a_killed_daemon(lab_name: str, standin: list[str]) -> None:
    lab = Lab(lab_name, hosts=1, nics=1, shiftd_cmd=standin)
    lab.up()
    first = lab.daemon("h0")
    assert first is not None and lab.restarts("h0") == 0
    os.kill(first.pid, signal.SIGKILL)  # the daemon this test's lab started
    second = wait_for(lambda: (daemon := lab.daemon("h0")) != first and daemon)
    assert second, "restarted"
    # and it runs: it writes its record again (read when complete)
    assert wait_for(lambda: _recorded_pid(lab, "h0") == second.pid)
    assert lab.restarts("h0") == 1 and lab.status()["healthy"]
    assert "killed by SIGKILL" in lab.log_path("h0").read_text()
    assert "1 restarts" in cli("status", "--name", lab_name).stdout

    # the daemon does not outlive its supervisor
    supervisor = state(lab)["pids"]["h0"]["pid"]
    os.kill(supervisor, signal.SIGKILL)
    assert wait_for(lambda: not pid_alive(second.pid) and not pid_alive(supervisor))
    assert not lab.status()["healthy"]


def test_a_clean_exit_is_not_restarted_and_a_crash_loop_backs_off(lab_name: str, standin: list[str]) -> None:
    lab = Lab(lab_name, hosts=1, nics=1, shiftd_cmd=[*standin, "--exit-after-ready", "0"])
    lab.up()
    supervisor = state(lab)["pids"]["h0"]["pid"]
    assert wait_for(lambda: not pid_alive(supervisor)), "a clean exit ends the service"
    assert lab.restarts("h0") == 0 and not lab.status()["healthy"]
    assert "clean exit: not restarted" in lab.log_path("h0").read_text()
    lab.down()

    lab = Lab(lab_name, hosts=1, nics=1, shiftd_cmd=[*standin, "--exit-after-ready", "3"])
    lab.up()
    started = time.monotonic()
    assert wait_for(lambda: lab.restarts("h0") >= 3, timeout=20)
    # delays of 0.5, 1 and 2 s between the three restarts (each run lives a second)
    assert time.monotonic() - started >= 0.5 + 1 + 2
    log = lab.log_path("h0").read_text()
    assert "exited with status 3" in log and "restarting in 2s" in log
