"""shiftctl status's agent lines: the reports an agent dropped are shown when there are any."""

from libshift.api.shift.v1 import admin_pb2, common_pb2
from shiftd.ctl import format_status


def agent_line(**fields) -> str:
    status = admin_pb2.StatusResponse(
        agents=[common_pb2.AgentInfo(agent_id="7-ab", pid=7, name="train", **fields)]
    )
    return format_status(status).splitlines()[-1]


def test_an_agent_that_dropped_reports_says_how_many():
    assert agent_line() == "agent 7-ab: pid 7 train qps=0 mrs=0 on_backup=0"
    assert agent_line(reports_dropped=3).endswith("on_backup=0 reports_dropped=3")
