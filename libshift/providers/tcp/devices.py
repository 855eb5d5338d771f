"""The tcp provider's devices, read without the daemon (the grammar is libshift.devicetable's).

Source order: the env var SHIFT_TCP_DEVICES (`mlx5_0=ens1f0np0,mlx5_1=ens2f0np0@h0`), else the `[devices]`
table of the TOML file at SHIFT_CONFIG (default /etc/shift/shiftd.toml), the same table shiftd reads. The
optional `@netns` of SHIFT_TCP_DEVICES puts the device's sockets in that network namespace (a lab host).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path

from libshift.devicetable import ENV_DEVICES, DeviceEntry, DeviceTableError, parse_list, parse_table
from libshift.providers import DeviceInfo
from libshift.vocabulary.errors import VerbsError

ENV_CONFIG = "SHIFT_CONFIG"
DEFAULT_CONFIG = "/etc/shift/shiftd.toml"
PROVIDER = "tcp"


def from_env(text: str) -> list[DeviceInfo]:
    try:
        return _infos(parse_list(text))
    except DeviceTableError as exc:
        raise VerbsError(str(exc)) from None


def from_config(path: Path) -> list[DeviceInfo]:
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise VerbsError(f"{path}: cannot read the device table: {exc}") from None
    try:
        return _infos(parse_table(data.get("devices", {})))
    except DeviceTableError as exc:
        raise VerbsError(f"{path}: {exc}") from None


def _infos(entries: list[DeviceEntry]) -> list[DeviceInfo]:
    return [DeviceInfo(name=e.name, provider=PROVIDER, netdev=e.netdev, netns=e.netns) for e in entries]


def load_devices(environ: Mapping[str, str] = os.environ) -> list[DeviceInfo]:
    """The configured tcp devices (empty when neither source names any)."""
    if environ.get(ENV_DEVICES):
        return from_env(environ[ENV_DEVICES])
    return from_config(Path(environ.get(ENV_CONFIG, DEFAULT_CONFIG)))
