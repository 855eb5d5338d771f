"""shiftd's config: defaults, a full file, and one clear line for each kind of mistake."""

import subprocess
import sys

import pytest

from shiftd import config


def test_empty_file_means_defaults(tmp_path):
    path = tmp_path / "shiftd.toml"
    path.write_text("")
    cfg = config.load(path)
    assert cfg.server.socket == "/run/shift/shiftd.sock"
    assert cfg.server.socket_mode == 0o660
    assert cfg.metrics.listen == "127.0.0.1:9477"
    assert cfg.etcd.prefix == "/shift/v1"
    assert cfg.devices == {}


def test_full_file(tmp_path):
    path = tmp_path / "shiftd.toml"
    path.write_text(
        """
host = "h0"
log_level = "debug"
[server]
socket = "/tmp/x.sock"
socket_mode = "0600"
admin_group = "wheel"
[etcd]
endpoints = ["198.19.0.1:2379", "http://198.19.0.2:2379"]
lease_ttl_seconds = 5
[health]
hold_down_seconds = 0.5
[damping]
penalty = 500
half_life_seconds = 2.5
max_suppress_seconds = 10
[devices]
mlx5_0 = "ens1f0np0"
mlx5_1 = "ens2f0np0"
"""
    )
    cfg = config.load(path)
    assert cfg.host == "h0"
    assert cfg.server.socket_mode == 0o600
    assert config.etcd_endpoints(cfg.etcd) == [("198.19.0.1", 2379), ("198.19.0.2", 2379)]
    assert cfg.health.hold_down_seconds == 0.5
    damping = cfg.damping
    assert (damping.penalty, damping.half_life_seconds, damping.reuse_threshold) == (500, 2.5, 750)
    assert cfg.devices == {"mlx5_0": "ens1f0np0", "mlx5_1": "ens2f0np0"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("bogus = 1", "bogus: unknown key"),
        ("[server]\nsockets = 'x'", "server.sockets: unknown key"),
        ("[etcd]\nlease_ttl_seconds = 'ten'", "etcd.lease_ttl_seconds: must be an integer"),
        ("[etcd]\nlease_ttl_seconds = 1", "etcd.lease_ttl_seconds: must be at least 2"),
        ("[etcd]\nendpoints = []", "etcd.endpoints: must be a non-empty list"),
        ("[etcd]\nendpoints = ['nohost']", "etcd.endpoints: 'nohost' is not HOST:PORT"),
        (
            "[etcd]\nendpoints = ['etcd-0:2379', 'etcd-1:2379']",
            "etcd.endpoints: 'etcd-0': with several endpoints each must be an IP address",
        ),
        ("[etcd]\nendpoints = ['10.0.0.1:2379', '[fd00::1]:2379']", "do not mix IPv4 and IPv6"),
        ("[etcd]\nprefix = 'shift'", "etcd.prefix: must start with '/'"),
        ("[server]\nsocket_mode = 660", "server.socket_mode: must be an octal string"),
        ("[server]\nsocket = 'relative.sock'", "server.socket: must be an absolute path"),
        ("[metrics]\nlisten = 'localhost'", "metrics.listen: 'localhost' is not HOST:PORT"),
        ("[health]\nhold_down_seconds = -1", "health.hold_down_seconds: must not be negative"),
        ("[damping]\npenalty = -1", "damping.penalty: must not be negative (0 turns damping off)"),
        ("[damping]\npenalty = nan", "damping.penalty: must not be negative"),
        ("[damping]\nhalf_life_seconds = nan", "damping.half_life_seconds: must be greater than 0"),
        ("[damping]\nreuse_threshold = 0", "damping.reuse_threshold: must be greater than 0"),
        ("[damping]\nhalf_life_seconds = 0", "damping.half_life_seconds: must be greater than 0"),
        ("[damping]\nsuppress_threshold = 750", "damping.suppress_threshold: must be above damping.reuse"),
        ("[damping]\nmax_suppress_seconds = 60", "the penalty's ceiling, reuse_threshold x 2^(max_suppress"),
        ("[damping]\nmax_suppress_seconds = 3841", "max_suppress_seconds: at most 64 half-lives (3840 s)"),
        ("[damping]\nhalf_life = 1", "damping.half_life: unknown key (known: penalty, suppress_threshold"),
        ("[monitors]\nnetlink = 'yes'", "monitors.netlink: must be true or false"),
        ("[monitors]\nrdma_devices = []", "monitors.rdma_devices: must be a non-empty list of strings"),
        ("log_level = 'loud'", "log_level: must be one of"),
        ("host = 'bad host'", "host: 'bad host' is not a valid host name"),
        ("[devices]\nmlx5_0 = 'name-far-too-long'", "devices.mlx5_0: 'name-far-too-long' is not a valid"),
        ("[devices]\nmlx5_0 = 'eth0'\nmlx5_1 = 'eth0'", "devices.mlx5_1: netdev 'eth0' is already used"),
        ("server = 3", "server: must be a table"),
        ("[etcd\n", "not valid TOML"),
    ],
)
def test_bad_config_names_key_and_problem(tmp_path, text, message):
    path = tmp_path / "shiftd.toml"
    path.write_text(text)
    with pytest.raises(config.ConfigError) as info:
        config.load(path)
    assert message in str(info.value)
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_file_is_one_line(tmp_path):
    with pytest.raises(config.ConfigError, match="no such file"):
        config.load(tmp_path / "absent.toml")


def test_daemon_refuses_bad_config_with_one_line(tmp_path):
    path = tmp_path / "shiftd.toml"
    path.write_text("[etcd]\nlease_ttl_seconds = 'x'\n")
    result = subprocess.run(
        [sys.executable, "-m", "shiftd.daemon", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "etcd.lease_ttl_seconds: must be an integer" in lines[0]


def test_check_config_accepts_good_file(tmp_path):
    path = tmp_path / "shiftd.toml"
    path.write_text("[devices]\nmlx5_0 = 'eth0'\n")
    result = subprocess.run(
        [sys.executable, "-m", "shiftd.daemon", "--config", str(path), "--check-config"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "OK" in result.stdout


def test_shipped_example_config_is_valid_and_equals_defaults():
    from pathlib import Path

    shipped = config.load(Path(__file__).resolve().parents[2] / "deploy" / "config" / "shiftd.toml")
    defaults = config.Config()
    assert shipped.server == defaults.server
    assert shipped.etcd == defaults.etcd
    assert shipped.metrics == defaults.metrics
    assert shipped.health == defaults.health
    assert shipped.damping == defaults.damping
    assert shipped.monitors == defaults.monitors
    assert shipped.faults == defaults.faults


CERT = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
KEY = "-----BEGIN PRIVATE KEY-----\nMIGH\n-----END PRIVATE KEY-----\n"


@pytest.fixture
def etcd_files(tmp_path):
    """Credential files as an operator would lay them out (contents are not checked beyond PEM)."""
    files = {"ca.pem": (CERT, 0o644), "node.pem": (CERT, 0o644), "node-key.pem": (KEY, 0o600)}
    files |= {"password": ("s3cret\n", 0o600), "open-password": ("s3cret\n", 0o644)}
    files |= {"open-key.pem": (KEY, 0o644), "empty": ("", 0o600), "not-pem": ("hello\n", 0o644)}
    for name, (text, mode) in files.items():
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(mode)
    return tmp_path


TLS_AUTH = """
[etcd]
endpoints = ["https://198.19.0.1:2379"]
ca_file = "{d}/ca.pem"
cert_file = "{d}/node.pem"
key_file = "{d}/node-key.pem"
user = "shiftd"
password_file = "{d}/password"
"""


def test_tls_and_auth_settings(etcd_files):
    from shiftd.registry_auth import EtcdSecurity

    path = etcd_files / "shiftd.toml"
    path.write_text(TLS_AUTH.format(d=etcd_files))
    cfg = config.load(path)
    assert config.etcd_endpoints(cfg.etcd) == [("198.19.0.1", 2379)]
    security = EtcdSecurity.from_config(cfg.etcd)
    assert security.tls
    assert (security.user, security.password_file) == ("shiftd", f"{etcd_files}/password")
    assert config.read_secret(security.password_file) == "s3cret"


@pytest.mark.parametrize(
    ("etcd", "message"),
    [
        ('endpoints = ["https://a:1"]', "etcd.ca_file: required with https:// endpoints"),
        ('endpoints = ["https://10.0.0.1:1", "http://10.0.0.2:1"]', "etcd.endpoints: do not mix http://"),
        (
            'endpoints = ["https://10.0.0.1:1", "https://10.0.0.2:1"]\nca_file = "{d}/ca.pem"',
            "etcd.server_name: required with several https:// endpoints",
        ),
        ('ca_file = "{d}/ca.pem"', "etcd.ca_file: TLS is set up but the endpoints are not https://"),
        ('endpoints = ["https://a:1"]\nca_file = "ca.pem"', "etcd.ca_file: must be an absolute path"),
        (
            'endpoints = ["https://a:1"]\nca_file = "{d}/absent.pem"',
            "etcd.ca_file: {d}/absent.pem: no such file",
        ),
        ('endpoints = ["https://a:1"]\nca_file = "{d}"', "etcd.ca_file: {d}: is a directory"),
        (
            'endpoints = ["https://a:1"]\nca_file = "{d}/not-pem"',
            "etcd.ca_file: {d}/not-pem is not a PEM file",
        ),
        (
            'endpoints = ["https://a:1"]\nca_file = "{d}/ca.pem"\ncert_file = "{d}/node.pem"',
            "etcd.cert_file: set without etcd.key_file",
        ),
        (
            'endpoints = ["https://a:1"]\nca_file = "{d}/ca.pem"\nkey_file = "{d}/node-key.pem"',
            "etcd.key_file: set without etcd.cert_file",
        ),
        (
            'endpoints = ["https://a:1"]\nca_file = "{d}/ca.pem"\ncert_file = "{d}/node.pem"\n'
            'key_file = "{d}/open-key.pem"',
            "etcd.key_file: {d}/open-key.pem is readable by every user (mode 0644)",
        ),
        ('user = "shiftd"', "etcd.user: set without etcd.password_file"),
        ('password_file = "{d}/password"', "etcd.password_file: set without etcd.user"),
        ('user = "a:b"\npassword_file = "{d}/password"', "etcd.user: 'a:b' is not a valid etcd user name"),
        (
            'user = "shiftd"\npassword_file = "{d}/open-password"',
            "etcd.password_file: {d}/open-password is readable by every user (mode 0644)",
        ),
        ('user = "shiftd"\npassword_file = "{d}/empty"', "etcd.password_file: {d}/empty is empty"),
    ],
)
def test_bad_tls_or_auth_setting_is_one_line(etcd_files, etcd, message):
    path = etcd_files / "shiftd.toml"
    path.write_text("[etcd]\n" + etcd.format(d=etcd_files) + "\n")
    with pytest.raises(config.ConfigError) as info:
        config.load(path)
    assert message.format(d=etcd_files) in str(info.value)
    assert "\n" not in str(info.value)


def test_daemon_refuses_https_without_ca_with_one_line(tmp_path):
    path = tmp_path / "shiftd.toml"
    path.write_text('[etcd]\nendpoints = ["https://127.0.0.1:2379"]\n')
    result = subprocess.run(
        [sys.executable, "-m", "shiftd.daemon", "--config", str(path), "--check-config"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"shiftd: {path}: etcd.ca_file: required with https:// endpoints"
    ]
