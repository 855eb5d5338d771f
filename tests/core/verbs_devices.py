"""The two RDMA devices the verbs backend's tests run RC between (SHIFT_TEST_VERBS_DEVICES, as the
conformance suite names them: rxe0,rxe1 in the Soft-RoCE VM), each with the GID index the verbs provider
would choose; the tests skip, saying so, where there are none."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from libshift.providers.verbs.convert import LINK_LAYER
from libshift.providers.verbs.gid import choose_gid, port_dir, port_netdev, read_gid_table

SYSFS = Path("/sys")
PORT = 1


@dataclass(frozen=True)
class Device:
    name: str
    gid_index: int


def device(name: str) -> Device:
    base = port_dir(SYSFS, name, PORT)
    if not base.is_dir():
        pytest.fail(f"SHIFT_TEST_VERBS_DEVICES names {name}, which has no port {PORT} in sysfs")
    link_layer = (base / "link_layer").read_text().strip()
    if link_layer not in LINK_LAYER.values():
        pytest.fail(f"{name}: unknown link layer {link_layer!r}")
    table = read_gid_table(SYSFS, name, PORT)
    return Device(name, choose_gid(table, link_layer, port_netdev(SYSFS, name, PORT)).index)


def verbs_pair() -> tuple[Device, Device]:
    names = [n for n in os.environ.get("SHIFT_TEST_VERBS_DEVICES", "").split(",") if n]
    if not names:
        pytest.skip("no RDMA devices named: set SHIFT_TEST_VERBS_DEVICES=rxe0,rxe1 (make test-rxe's env)")
    a, b = (names * 2)[:2]
    return device(a), device(b)
