"""The exposition of /metrics, whole, against a committed file (node_exporter's e2e-output.txt check).

A daemon in this process (never started: no etcd, no monitors) is brought to a fixed state through the
paths the running daemon takes (NIC changes from the monitors, an agent's registration, publications and
failover reports, counted gRPC calls), and /metrics is read from the HTTP server shiftd runs. Any change of
a name, a label, a help text, a bucket or a value shows as a diff. After a deliberate change, regenerate:

    SHIFT_UPDATE_GOLDEN=1 pytest tests/shiftd/test_metrics_golden.py
"""

from __future__ import annotations

import asyncio
import difflib
import os
import platform
import re
import urllib.request
from pathlib import Path

from daemon_harness import offline_daemon

from libshift.api.shift.v1 import common_pb2
from shiftd import __version__
from shiftd.config import DampingConfig
from shiftd.daemon import BOOKKEEPING_DELAY, Daemon
from shiftd.nic import LinkStatus, PortStatus, Traffic
from shiftd.peercred import PeerCred

GOLDEN = Path(__file__).parents[1] / "fixtures" / "metrics" / "golden.txt"
UPDATE = "SHIFT_UPDATE_GOLDEN"
AGENT = PeerCred(pid=4242, uid=1000, gid=1000)


def up(netdev: str, address: str) -> LinkStatus:
    return LinkStatus(netdev, present=True, admin_up=True, operstate="up", carrier=True, addresses=(address,))


async def bring_to_state(daemon: Daemon) -> None:
    """mlx5_0 and tcp0 up, mlx5_1 lost its carrier, mlx5_2 never heard of; mlx5_0 resent some TCP; one
    agent with two mappings that failed over twice and failed back once; some gRPC calls and etcd errors."""
    nics = daemon.nics
    for device in ("mlx5_0", "mlx5_1"):
        nics.port_changed(PortStatus(device, 1, "ACTIVE", "LinkUp"))
    nics.link_changed(up("ens1f0np0", "198.18.0.10"))
    nics.link_changed(up("ens1f1np1", "198.18.1.10"))
    nics.link_changed(up("lo", "127.0.0.1"))
    nics.link_changed(LinkStatus("ens1f1np1", present=True, admin_up=True, operstate="down"))
    nics.traffic_sent({"198.18.0.10": Traffic(1000, 5, 0, 0)})  # mlx5_0: 0.5% resent, not yet lossy
    await asyncio.sleep(4 * BOOKKEEPING_DELAY)  # the metrics follow a transition after this delay

    info = daemon.agents.register("unix:agent", AGENT, AGENT.pid, "trainer", "job-7")
    primary = common_pb2.Endpoint(gid="::ffff:198.18.0.10", qpn=17, psn=1, device="mlx5_0")
    backup = common_pb2.Endpoint(gid="::ffff:198.18.1.10", qpn=18, psn=2, device="mlx5_1")
    mr = common_pb2.MrMapping(
        gid="::ffff:198.18.0.10", rkey=7, backup_gid="::ffff:198.18.1.10", backup_rkey=8
    )
    daemon.agents.publish(info.agent_id, AGENT, [common_pb2.QpMapping(primary=primary, backup=backup)], [mr])
    reports = [
        common_pb2.FailoverReport(
            device="mlx5_0", backup_device="mlx5_1", default_device="mlx5_0", reason="nic_event",
            downtime_seconds=0.004, reposted_work_requests=3, qps=2, time_unix_nanos=1,
        ),
        common_pb2.FailoverReport(
            device="mlx5_0", backup_device="mlx5_1", default_device="mlx5_0", reason="error_completion",
            downtime_seconds=0.3, reposted_work_requests=5, qps=1, time_unix_nanos=2,
        ),
        common_pb2.FailoverReport(
            kind=common_pb2.FAILOVER_KIND_FAILBACK, device="mlx5_1", backup_device="mlx5_0",
            default_device="mlx5_0", qps=1, time_unix_nanos=3,
        ),
    ]  # fmt: skip
    for report in reports:
        daemon.agents.record_switch(info.agent_id, AGENT, report)
        daemon.record_failover(report)
    for method, code in [("Register", "OK"), ("Publish", "OK"), ("Publish", "OK"), ("LookupQp", "NOT_FOUND")]:
        daemon.count_request(method, code)
    # etcd errors are counted by the registry's link to etcd, which an offline daemon never opens
    daemon.metrics.etcd_errors.labels("unavailable").inc(2)


def scrape(daemon: Daemon) -> str:
    daemon.metrics.serve("127.0.0.1", 0)
    try:
        with urllib.request.urlopen(f"http://{daemon.metrics.address}/metrics", timeout=10) as reply:
            return reply.read().decode()
    finally:
        daemon.metrics.close()


def without_build(text: str) -> str:
    """shift_build_info's labels change with every release and interpreter: the file holds placeholders."""
    line = f'shift_build_info{{python_version="{platform.python_version()}",version="{__version__}"}}'
    assert line in text, "shift_build_info's labels are not the ones expected"
    return text.replace(line, 'shift_build_info{python_version="PYTHON",version="VERSION"}')


def test_metrics_exposition_matches_the_golden_file(tmp_path: Path) -> None:
    # a penalty decays with the real clock between the flap and the scrape: none, for a text that never varies
    daemon = offline_daemon(tmp_path, damping=DampingConfig(penalty=0))
    asyncio.run(bring_to_state(daemon))
    text = without_build(scrape(daemon))
    assert not re.search(r"_created\b", text)  # node_exporter's conventions: no *_created series
    if os.environ.get(UPDATE):
        GOLDEN.write_text(text)
    expected = GOLDEN.read_text()
    if text != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True), text.splitlines(keepends=True), str(GOLDEN), "/metrics"
            )
        )
        raise AssertionError(
            f"/metrics differs from the golden file (regenerate: {UPDATE}=1 pytest {__file__}):\n{diff}"
        )
