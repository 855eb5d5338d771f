"""deploy/grafana: the dashboard's layout and data source, every query parsed by Prometheus's own
PromQL parser (promtool check rules), and every metric it queries found in a live shiftd."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from test_deploy_prometheus import (
    promtool,
    queried_metrics,
    scrape_shiftd,
    selectable_names,
)

GRAFANA = Path(__file__).resolve().parents[2] / "deploy" / "grafana"
DASHBOARD = GRAFANA / "shift-dashboard.json"
# What Grafana substitutes before a query reaches Prometheus.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$instance": ".*"}
LABEL_VALUES = re.compile(r"^label_values\((\w+), *\w+\)$")
# The dashboard's subjects, by the metric that shows each.
SUBJECTS = {
    "NIC state per host": "shift_nic_up",
    "failovers": "shift_failovers_total",
    "failbacks": "shift_failbacks_total",
    "downtime histogram": "shift_failover_downtime_seconds_bucket",
    "QPs on backup": "shift_backup_qps",
    "etcd health": "shift_etcd_up",
    "agents": "shift_agents",
    "link events": "shift_link_events_total",
    "flap penalty": "shift_nic_flap_penalty",
}


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels() -> list[dict]:
    """Every panel that shows data, also those inside collapsed rows."""
    found = []
    for panel in dashboard()["panels"]:
        found += panel.get("panels", []) if panel["type"] == "row" else [panel]
    return found


def queries() -> dict[str, str]:
    """name -> PromQL as Prometheus receives it, for every panel target and query variable."""
    exprs = {f"panel{p['id']}_{t['refId']}": t["expr"] for p in panels() for t in p["targets"]}
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            # label_values(METRIC, LABEL) is Grafana's; the series it reads is METRIC
            exprs[f"variable_{variable['name']}"] = LABEL_VALUES.match(variable["definition"]).group(1)
    for name, expr in exprs.items():
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, f"{name}: a Grafana variable the test does not know: {expr}"
        exprs[name] = expr
    return exprs


def test_panels_use_the_provisioned_data_source_and_do_not_overlap():
    board = dashboard()
    provisioned = yaml.safe_load((GRAFANA / "provisioning/datasources/shift.yml").read_text())
    uid = provisioned["datasources"][0]["uid"]
    (variable,) = [v for v in board["templating"]["list"] if v["type"] == "datasource"]
    assert variable["current"]["value"] == uid
    taken: set[tuple[int, int]] = set()
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        cells = {
            (x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells
    for panel in panels():
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${" + variable["name"] + "}", panel["title"]
        assert panel["description"], panel["title"]


def test_dashboard_provider_points_at_a_folder():
    provider = yaml.safe_load((GRAFANA / "provisioning/dashboards/shift.yml").read_text())["providers"][0]
    assert provider["type"] == "file"
    assert provider["options"]["path"].startswith("/")


def test_every_query_parses_as_promql(tmp_path):
    exprs = queries()
    rules = {
        "groups": [
            {"name": "grafana", "rules": [{"record": f"grafana:{n}", "expr": e} for n, e in exprs.items()]}
        ]
    }
    path = tmp_path / "grafana-queries.yml"
    path.write_text(yaml.safe_dump(rules))
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in result.stdout


def test_dashboard_shows_every_subject():
    queried = set().union(*map(queried_metrics, queries().values()))
    missing = {subject for subject, metric in SUBJECTS.items() if metric not in queried}
    assert missing == set()


@pytest.mark.lab
def test_every_queried_metric_is_exported_by_shiftd(tmp_path):
    exported = selectable_names(scrape_shiftd(tmp_path / "shiftd"))
    queried = set().union(*map(queried_metrics, queries().values()))
    assert queried - exported == set()
