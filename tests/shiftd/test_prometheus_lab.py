"""A real Prometheus scrapes the lab's daemons, and the project's alerts fire and resolve on a real failure.

Prometheus (Debian's /usr/bin/prometheus) runs inside the lab's management namespace, where the daemons'
metrics addresses 198.19.0.(10+i):9477 are reachable, with its own data directory, scraping and
evaluating every second. Its rules are deploy/prometheus/shift-alerts.yml with each `for:` cut to 2 s
(minutes are too long for a test; the expressions and labels are the project's own, unchanged).
`shiftctl fail-nic` on h0 must fire ShiftNicDown and ShiftNoBackupNic for h0 alone, and `recover-nic` must
resolve them. Lab names start with "pfp".
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from waiting import wait_until

from shiftlab import netns
from shiftlab.lab import METRICS_PORT, Lab

pytestmark = [pytest.mark.lab, pytest.mark.timeout(180)]

RULES = Path(__file__).parents[2] / "deploy" / "prometheus" / "shift-alerts.yml"
TEST_FOR = "2s"
LISTEN = "127.0.0.1:9090"  # inside the management namespace: no clash with anything on the host


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lab = Lab(f"pfp{os.getpid() % 100000}", hosts=2, nics=2)
    lab.up()
    try:
        yield lab
    finally:
        lab.down()


def short_rules(target: Path) -> None:
    """The project's alert rules with every `for:` cut to TEST_FOR."""
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = TEST_FOR
    target.write_text(yaml.safe_dump(rules, sort_keys=False))


class Prometheus:
    """A prometheus server in the lab's management namespace, asked through its HTTP API."""

    def __init__(self, lab: Lab, workdir: Path) -> None:
        self.ns = lab.shape.mgmt_ns
        short_rules(workdir / "rules.yml")
        targets = [f"{lab.shape.mgmt_address(i)}:{METRICS_PORT}" for i in range(lab.shape.hosts)]
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": ["rules.yml"],
            "scrape_configs": [{"job_name": "shift", "static_configs": [{"targets": targets}]}],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = workdir / "prometheus.log"
        argv = [
            "prometheus",
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address={LISTEN}",
        ]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                netns.command(self.ns, argv), stdout=log, stderr=log, stdin=subprocess.DEVNULL, cwd=workdir
            )

    def get(self, path: str) -> Any:
        def fetch() -> Any:
            with urllib.request.urlopen(f"http://{LISTEN}{path}", timeout=5) as response:
                return json.load(response)["data"]

        return netns.run(self.ns, fetch)

    def ready(self) -> bool:
        try:
            return self.get("/api/v1/status/runtimeinfo") is not None
        except OSError:
            return False

    def targets_up(self) -> set[str]:
        active = self.get("/api/v1/targets")["activeTargets"]
        return {t["labels"]["instance"] for t in active if t["health"] == "up"}

    def alerts(self, state: str = "firing") -> set[tuple[str, str, str]]:
        """(alert, instance, device) of the alerts in `state`."""
        return {
            (a["labels"]["alertname"], a["labels"]["instance"], a["labels"].get("device", ""))
            for a in self.get("/api/v1/alerts")["alerts"]
            if a["state"] == state
        }

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def prometheus(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    server = Prometheus(lab, tmp_path_factory.mktemp("prometheus"))
    try:
        assert wait_until(server.ready, timeout=30), server.log.read_text()[-3000:]
        yield server
    finally:
        server.stop()


def shiftctl(lab: Lab, host: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv, env = lab.exec_command(host, ["shiftctl", "--timeout", "20", *args])
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def test_the_rules_are_the_projects_with_short_for(tmp_path: Path) -> None:
    short_rules(tmp_path / "rules.yml")
    ours, theirs = (yaml.safe_load(p.read_text()) for p in (tmp_path / "rules.yml", RULES))
    for mine, original in zip(ours["groups"][0]["rules"], theirs["groups"][0]["rules"], strict=True):
        assert mine["expr"] == original["expr"] and mine["labels"] == original["labels"]
        assert mine.get("for") == (TEST_FOR if "for" in original else None)
    result = subprocess.run(["promtool", "check", "rules", str(tmp_path / "rules.yml")], capture_output=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_nic_failure_fires_the_alerts_and_recovery_resolves_them(lab: Lab, prometheus: Prometheus) -> None:
    h0, h1 = (f"{lab.shape.mgmt_address(i)}:{METRICS_PORT}" for i in (0, 1))
    assert wait_until(lambda: prometheus.targets_up() == {h0, h1}, timeout=30)
    assert prometheus.alerts("firing") == set() and prometheus.alerts("pending") == set()

    result = shiftctl(lab, "h0", "fail-nic", "mlx5_0")
    assert result.returncode == 0, result.stderr
    try:
        expected = {("ShiftNicDown", h0, "mlx5_0"), ("ShiftNoBackupNic", h0, "")}
        assert wait_until(lambda: prometheus.alerts("firing") == expected, timeout=60), prometheus.alerts()
    finally:
        result = shiftctl(lab, "h0", "recover-nic", "mlx5_0")
    assert result.returncode == 0, result.stderr
    assert wait_until(
        lambda: not prometheus.alerts("firing") and not prometheus.alerts("pending"), timeout=60
    )
