"""shift-perf between two lab hosts: every test runs, and -a walks every size without a failed WR."""

import json
import subprocess
import time

import pytest
from labs import running_lab

pytestmark = [pytest.mark.lab, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def lab():
    with running_lab("pc", hosts=2, nics=1) as lab:
        yield lab


def run_pair(lab, test, *args):
    server_argv, env = lab.exec_command("h1", ["shift-perf", test, "-d", "mlx5_0", *args])
    server = subprocess.Popen(server_argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)  # the server listens on its control port
        client_argv, env = lab.exec_command(
            "h0", ["shift-perf", test, "-d", "mlx5_0", *args, "--json", lab.shape.rail_address(0, 1)]
        )
        client = subprocess.run(client_argv, env=env, capture_output=True, text=True, timeout=240)
        assert client.returncode == 0, client.stderr
        server.wait(timeout=30)
        assert server.returncode == 0, server.stderr.read()
        return json.loads(client.stdout)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


@pytest.mark.parametrize("test", ["send_lat", "write_lat"])
def test_latency_sweep_over_all_sizes(lab, test):
    rows = run_pair(lab, test, "-a", "-n", "5")
    assert [r["size"] for r in rows] == [8 << i for i in range(20)]  # 8 B .. 4 MiB
    assert all(r["value"] > 0 and r["limit"] > 0 for r in rows)


@pytest.mark.parametrize("test", ["write_bw", "send_bw", "read_bw"])
def test_bandwidth_has_its_raw_ratio(lab, test):
    (row,) = run_pair(lab, test, "-s", "65536", "-n", "64")
    assert row["test"] == test and row["size"] == 65536
    assert row["ratio"] == pytest.approx(row["value"] / row["limit"])
