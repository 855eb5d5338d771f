"""shiftd's configuration: one TOML file, every key defaulted, validated at start.

A bad file must stop the daemon with one line that names the key and the problem, so
every check raises ConfigError with the dotted key path.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from libshift.devicetable import DeviceTableError, parse_table

DEFAULT_PATH = Path("/etc/shift/shiftd.toml")
LOG_LEVELS = ("debug", "info", "warning", "error")
MAX_SUPPRESS_HALF_LIVES = 64  # damping's ceiling is reuse x 2^64 at most: ample, and a float holds it


class ConfigError(ValueError):
    """A problem in the configuration file; str() is the one line shown to the operator."""


@dataclass(frozen=True)
class ServerConfig:
    socket: str = "/run/shift/shiftd.sock"
    socket_mode: int = 0o660
    socket_group: str = "shift"
    admin_group: str = "shift-admin"
    max_message_bytes: int = 1 << 20
    publish_rate: float = 5000.0  # mappings a second that one connection may publish, sustained
    publish_burst: int = 20000  # ... and at once


@dataclass(frozen=True)
class EtcdConfig:
    endpoints: tuple[str, ...] = ("127.0.0.1:2379",)
    prefix: str = "/shift/v1"
    lease_ttl_seconds: int = 10
    timeout_seconds: float = 2.0
    retry_initial_seconds: float = 0.2
    retry_max_seconds: float = 5.0
    # TLS (https:// endpoints) and etcd auth; "" is unset. Paths are absolute.
    ca_file: str = ""  # the CA that signed etcd's server certificates
    cert_file: str = ""  # this host's client certificate (etcd --client-cert-auth) ...
    key_file: str = ""  # ... and its key
    server_name: str = ""  # the name in etcd's certificates (required with several https endpoints)
    user: str = ""  # the etcd user ...
    password_file: str = ""  # ... whose password is this file's first line (never in this file)


@dataclass(frozen=True)
class MetricsConfig:
    listen: str = "127.0.0.1:9477"  # "" disables the metrics endpoint


@dataclass(frozen=True)
class HealthConfig:
    hold_down_seconds: float = 2.0  # a link must stay up this long before it counts as UP again


@dataclass(frozen=True)
class DampingConfig:
    """Flap damping after RFC 2439 (shiftd/damping.py; docs/operations.md). penalty = 0 turns it off."""

    penalty: float = 1000.0  # what each flap of the NIC's own link or port adds
    suppress_threshold: float = 2000.0  # a flap that takes the penalty above this suppresses the NIC ...
    reuse_threshold: float = 750.0  # ... which then stays DOWN until the penalty has decayed to this
    half_life_seconds: float = 60.0  # the penalty halves in this time
    max_suppress_seconds: float = 300.0  # the longest a NIC that went quiet stays suppressed

    @property
    def ceiling(self) -> float:
        """The penalty's most: from it, max_suppress_seconds of quiet decay it to the reuse threshold."""
        return self.reuse_threshold * 2 ** (self.max_suppress_seconds / self.half_life_seconds)


@dataclass(frozen=True)
class LossConfig:
    """The judge of a NIC's TCP retransmissions (shiftd/loss.py; docs/operations.md: Degraded paths)."""

    window_seconds: float = 0.5  # the loss is judged over this much of monitors.tcp_loss's last polls ...
    min_segments: int = 200  # ... once they hold at least this many data segments sent
    enter_percent: float = 2.0  # DEGRADED (retransmits) when this share of them were retransmissions
    exit_percent: float = 0.5  # a window below this counts as healthy ...
    hold_seconds: float = 30.0  # ... and the NIC is UP again this long after the last window that was not


@dataclass(frozen=True)
class SlowConfig:
    """The judge of a NIC's throughput against its own best (shiftd/slow.py; docs/operations.md)."""

    window_seconds: float = 1.0  # the rate is judged over this much of monitors.tcp_loss's last polls ...
    min_polls: int = 3  # ... once at least this many of them found the NIC's traffic held back by the network
    enter_fraction: float = 0.1  # DEGRADED (slow) when that traffic ran at less than this share of the best
    exit_fraction: float = 0.3  # a window at this share or more counts as healthy ...
    hold_seconds: float = 30.0  # ... and the NIC is UP again this long after the last window that was not
    best_half_life_seconds: float = 3600.0  # the best rate decays so: a lasting change becomes the norm
    min_best_bytes_per_second: float = 1e6  # no verdict until the NIC has carried this much in a window


@dataclass(frozen=True)
class MonitorsConfig:
    netlink: bool = True
    udev: bool = True
    rdma_sysfs: bool = True
    sysfs_root: str = "/sys"
    rdma_poll_seconds: float = 0.5
    rdma_async_events: bool = True  # read the ports at once on a device's PORT_ERR / PORT_ACTIVE
    tcp_loss: bool = True  # count the NICs' TCP retransmissions (sock_diag) for the loss judge ([loss])
    tcp_loss_poll_seconds: float = 0.2  # a dump of 2,000 sockets costs ~8 ms of CPU
    # the RDMA devices in sysfs that are this host's; empty: every one (a lab on one kernel lists its host's)
    rdma_devices: tuple[str, ...] = ()


@dataclass(frozen=True)
class FaultsConfig:
    flap_period_seconds: float = 1.0


@dataclass(frozen=True)
class Config:
    host: str = field(default_factory=socket.gethostname)
    log_level: str = "info"
    server: ServerConfig = field(default_factory=ServerConfig)
    etcd: EtcdConfig = field(default_factory=EtcdConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    damping: DampingConfig = field(default_factory=DampingConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    slow: SlowConfig = field(default_factory=SlowConfig)
    monitors: MonitorsConfig = field(default_factory=MonitorsConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    # tcp-provider devices: RDMA device name -> netdev
    devices: dict[str, str] = field(default_factory=dict)


SECTIONS: dict[str, type] = {
    "server": ServerConfig,
    "etcd": EtcdConfig,
    "metrics": MetricsConfig,
    "health": HealthConfig,
    "damping": DampingConfig,
    "loss": LossConfig,
    "slow": SlowConfig,
    "monitors": MonitorsConfig,
    "faults": FaultsConfig,
}


def load(path: str | Path | None = None) -> Config:
    """Read and validate a config file; a missing default file means all defaults."""
    if path is None:
        if not DEFAULT_PATH.exists():
            return Config()
        path = DEFAULT_PATH
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except PermissionError:
        raise ConfigError(f"{path}: permission denied") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    try:
        return parse(data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def parse(data: dict[str, Any]) -> Config:
    """Build a Config from parsed TOML, rejecting unknown keys and wrong types or ranges."""
    top: dict[str, Any] = {}
    for key, value in data.items():
        if key in SECTIONS:
            top[key] = _section(key, SECTIONS[key], value)
        elif key == "host":
            top["host"] = _host(value)
        elif key == "log_level":
            if value not in LOG_LEVELS:
                raise ConfigError(f"log_level: must be one of {', '.join(LOG_LEVELS)}, not {value!r}")
            top["log_level"] = value
        elif key == "devices":
            top["devices"] = _devices(value)
        else:
            raise ConfigError(f"{key}: unknown key")
    return Config(**top)


def _section(name: str, cls: type, value: Any) -> Any:
    if not isinstance(value, dict):
        raise ConfigError(f"{name}: must be a table, like [{name}]")
    known = {f.name: f for f in fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, item in value.items():
        if key not in known:
            raise ConfigError(f"{name}.{key}: unknown key (known: {', '.join(known)})")
        default = getattr(cls(), key)
        kwargs[key] = _coerce(f"{name}.{key}", item, default)
    section = cls(**kwargs)
    _check_ranges(name, section)
    return section


def _coerce(key: str, value: Any, default: Any) -> Any:
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: must be true or false, not {value!r}")
        return value
    if key == "server.socket_mode":
        return _mode(key, value)
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: must be an integer, not {value!r}")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key}: must be a number, not {value!r}")
        return float(value)
    if isinstance(default, str):
        if not isinstance(value, str):
            raise ConfigError(f"{key}: must be a string, not {value!r}")
        return value
    if isinstance(default, tuple):
        if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
            raise ConfigError(f"{key}: must be a non-empty list of strings")
        return tuple(value)
    raise AssertionError(f"no coercion for {key}")


def _mode(key: str, value: Any) -> int:
    if isinstance(value, str) and re.fullmatch(r"0?[0-7]{3}", value):
        return int(value, 8)
    raise ConfigError(f'{key}: must be an octal string such as "0660", not {value!r}')


def _check_ranges(name: str, section: Any) -> None:
    positive = {
        "etcd": ("lease_ttl_seconds", "timeout_seconds", "retry_initial_seconds", "retry_max_seconds"),
        "health": (),
        "damping": ("reuse_threshold", "half_life_seconds", "max_suppress_seconds"),
        "loss": ("window_seconds", "min_segments", "enter_percent", "exit_percent"),
        "slow": ("window_seconds", "min_polls", "enter_fraction", "exit_fraction", "best_half_life_seconds"),
        "monitors": ("rdma_poll_seconds", "tcp_loss_poll_seconds"),
        "faults": ("flap_period_seconds",),
        "server": ("max_message_bytes", "publish_rate", "publish_burst"),
    }
    for key in positive.get(name, ()):
        if not getattr(section, key) > 0:  # also refuses TOML's nan
            raise ConfigError(f"{name}.{key}: must be greater than 0")
    if name == "health" and section.hold_down_seconds < 0:
        raise ConfigError("health.hold_down_seconds: must not be negative")
    if name == "damping":
        _check_damping(section)
    if name == "loss":
        _check_loss(section)
    if name == "slow":
        _check_slow(section)
    if name == "etcd":
        if section.lease_ttl_seconds < 2:
            raise ConfigError("etcd.lease_ttl_seconds: must be at least 2")
        if not section.prefix.startswith("/") or section.prefix.endswith("/"):
            raise ConfigError("etcd.prefix: must start with '/' and not end with '/'")
        if section.retry_max_seconds < section.retry_initial_seconds:
            raise ConfigError("etcd.retry_max_seconds: must not be below etcd.retry_initial_seconds")
        _check_etcd_security(section)
    if name == "server":
        if not section.socket.startswith("/"):
            raise ConfigError("server.socket: must be an absolute path")
        if section.max_message_bytes < 1024:
            raise ConfigError("server.max_message_bytes: must be at least 1024")
    if name == "metrics" and section.listen:
        parse_host_port("metrics.listen", section.listen)


def _check_damping(damping: DampingConfig) -> None:
    if not damping.penalty >= 0:
        raise ConfigError("damping.penalty: must not be negative (0 turns damping off)")
    if not damping.suppress_threshold > damping.reuse_threshold:
        raise ConfigError("damping.suppress_threshold: must be above damping.reuse_threshold")
    most = MAX_SUPPRESS_HALF_LIVES * damping.half_life_seconds
    if damping.max_suppress_seconds > most:
        limit = f"at most {MAX_SUPPRESS_HALF_LIVES} half-lives ({most:g} s)"
        raise ConfigError(f"damping.max_suppress_seconds: {limit}")
    if not damping.ceiling > damping.suppress_threshold:
        raise ConfigError(
            f"damping.max_suppress_seconds: too short: the penalty's ceiling, reuse_threshold x "
            f"2^(max_suppress_seconds / half_life_seconds) = {damping.ceiling:.0f}, must be above "
            "suppress_threshold, or no NIC is ever suppressed"
        )


def _check_loss(loss: LossConfig) -> None:
    if not loss.enter_percent <= 100:
        raise ConfigError("loss.enter_percent: must be at most 100")
    if not loss.exit_percent <= loss.enter_percent:
        raise ConfigError("loss.exit_percent: must not be above loss.enter_percent")
    if not loss.hold_seconds >= 0:
        raise ConfigError("loss.hold_seconds: must not be negative")


def _check_slow(slow: SlowConfig) -> None:
    if not slow.enter_fraction <= slow.exit_fraction <= 1:
        raise ConfigError("slow.exit_fraction: must be between slow.enter_fraction and 1")
    if not slow.hold_seconds >= 0:
        raise ConfigError("slow.hold_seconds: must not be negative")
    if not slow.min_best_bytes_per_second >= 0:
        raise ConfigError("slow.min_best_bytes_per_second: must not be negative")


def _check_etcd_security(etcd: EtcdConfig) -> None:
    """TLS follows the endpoints' scheme; each file named must be there and readable, now."""
    schemes = {_scheme(e) for e in etcd.endpoints}
    hosts = [_endpoint(endpoint)[0] for endpoint in etcd.endpoints]
    if len(hosts) > 1:
        _check_member_addresses(hosts)
    if len(schemes) > 1:
        raise ConfigError("etcd.endpoints: do not mix http:// and https:// endpoints")
    if schemes == {"https"}:
        if not etcd.ca_file:
            raise ConfigError("etcd.ca_file: required with https:// endpoints")
        if len(etcd.endpoints) > 1 and not etcd.server_name:
            raise ConfigError(
                "etcd.server_name: required with several https:// endpoints "
                "(a name that every member's certificate holds)"
            )
    else:
        for key in ("ca_file", "cert_file", "key_file", "server_name"):
            if getattr(etcd, key):
                raise ConfigError(f"etcd.{key}: TLS is set up but the endpoints are not https://")
    for key, other in (("cert_file", "key_file"), ("key_file", "cert_file"), ("user", "password_file")):
        if getattr(etcd, key) and not getattr(etcd, other):
            raise ConfigError(f"etcd.{key}: set without etcd.{other}")
    if etcd.password_file and not etcd.user:
        raise ConfigError("etcd.password_file: set without etcd.user")
    if etcd.user and not re.fullmatch(r"[^\s:]{1,128}", etcd.user):
        raise ConfigError(f"etcd.user: {etcd.user!r} is not a valid etcd user name")
    _check_file("etcd.ca_file", etcd.ca_file, "-----BEGIN CERTIFICATE-----")
    _check_file("etcd.cert_file", etcd.cert_file, "-----BEGIN CERTIFICATE-----")
    _check_file("etcd.key_file", etcd.key_file, "PRIVATE KEY-----", secret=True)
    _check_file("etcd.password_file", etcd.password_file, "", secret=True)


def _check_member_addresses(hosts: list[str]) -> None:
    """Several members are dialled through one gRPC target that lists addresses and resolves no names."""
    versions = set()
    for host in hosts:
        try:
            versions.add(ipaddress.ip_address(host.strip("[]")).version)
        except ValueError:
            raise ConfigError(
                f"etcd.endpoints: {host!r}: with several endpoints each must be an IP address "
                "(or give one DNS name that resolves to every member)"
            ) from None
    if len(versions) > 1:
        raise ConfigError("etcd.endpoints: do not mix IPv4 and IPv6 addresses")


def _check_file(key: str, path: str, marker: str, secret: bool = False) -> None:
    """One line for each way a credential file can be wrong; a secret must not be world-readable."""
    if not path:
        return
    if not path.startswith("/"):
        raise ConfigError(f"{key}: must be an absolute path, not {path!r}")
    try:
        mode = Path(path).stat().st_mode
        text = read_secret(path) if secret and not marker else Path(path).read_text(errors="replace")
    except FileNotFoundError:
        raise ConfigError(f"{key}: {path}: no such file") from None
    except PermissionError:
        raise ConfigError(f"{key}: {path}: permission denied") from None
    except IsADirectoryError:
        raise ConfigError(f"{key}: {path}: is a directory, not a file") from None
    except OSError as exc:
        raise ConfigError(f"{key}: {path}: {exc.strerror}") from None
    if secret and mode & 0o004:
        raise ConfigError(f"{key}: {path} is readable by every user (mode {mode & 0o777:04o}); chmod o-r it")
    if not text:
        raise ConfigError(f"{key}: {path} is empty")
    if marker not in text:
        raise ConfigError(f"{key}: {path} is not a PEM file ({marker.strip('-')} not found)")


def read_secret(path: str) -> str:
    """A password file's first line, without its line ending (the way `etcdctl` users write it)."""
    with open(path) as file:
        return file.readline().rstrip("\r\n")


def _scheme(endpoint: str) -> str:
    return "https" if endpoint.startswith("https://") else "http"


def _endpoint(endpoint: str) -> tuple[str, int]:
    text = endpoint.removeprefix("http://").removeprefix("https://")
    return parse_host_port("etcd.endpoints", text)


def etcd_endpoints(config: EtcdConfig) -> list[tuple[str, int]]:
    """The etcd endpoints as (host, port) pairs."""
    return [_endpoint(e) for e in config.endpoints]


def parse_host_port(key: str, text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{key}: {text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def _host(value: Any) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", value):
        raise ConfigError(f"host: {value!r} is not a valid host name")
    return value


def _devices(value: Any) -> dict[str, str]:
    try:
        return {entry.name: entry.netdev for entry in parse_table(value)}
    except DeviceTableError as exc:
        raise ConfigError(str(exc)) from None
