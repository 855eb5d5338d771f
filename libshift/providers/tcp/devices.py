"""The tcp provider's device table, `name -> netdev[@netns]`, read without the daemon.

Source order: the env var SHIFT_TCP_DEVICES (`mlx5_0=ens1f0np0,mlx5_1=ens2f0np0@h0`), else the `[devices]`
table of the TOML file at SHIFT_CONFIG (default /etc/shift/shiftd.toml), the same table shiftd reads. The
optional `@netns` puts the device's sockets in that network namespace (a lab host).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path

from libshift.providers import DeviceInfo
from libshift.vocabulary.errors import VerbsError

ENV_DEVICES = "SHIFT_TCP_DEVICES"
ENV_CONFIG = "SHIFT_CONFIG"
DEFAULT_CONFIG = "/etc/shift/shiftd.toml"
PROVIDER = "tcp"


def parse_device(name: str, value: str) -> DeviceInfo:
    """One table entry: `netdev` or `netdev@netns`."""
    netdev, _, netns = value.strip().partition("@")
    if not name.strip() or not netdev:
        raise VerbsError(f"tcp device {name!r}: expected name=netdev[@netns], got {value!r}")
    return DeviceInfo(name=name.strip(), provider=PROVIDER, netdev=netdev, netns=netns or None)


def from_env(text: str) -> list[DeviceInfo]:
    devices = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep:
            raise VerbsError(f"{ENV_DEVICES}: expected name=netdev[@netns], got {item!r}")
        devices.append(parse_device(name, value))
    return devices


def from_config(path: Path) -> list[DeviceInfo]:
    try:
        table = tomllib.loads(path.read_text()).get("devices", {})
    except FileNotFoundError:
        return []
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise VerbsError(f"{path}: cannot read the device table: {exc}") from None
    if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
        raise VerbsError(f'{path}: [devices] must be a table of name = "netdev"')
    return [parse_device(name, value) for name, value in table.items()]


def load_devices(environ: Mapping[str, str] = os.environ) -> list[DeviceInfo]:
    """The configured tcp devices (empty when neither source names any)."""
    if environ.get(ENV_DEVICES):
        return from_env(environ[ENV_DEVICES])
    return from_config(Path(environ.get(ENV_CONFIG, DEFAULT_CONFIG)))
