"""What a lab host's processes (its shiftd, and programs run with exec_command) get of the caller's
environment: all of it but the caller's device table, so that SHIFT_TCP_ENGINE=native reaches them."""

from __future__ import annotations

from pathlib import Path

import pytest

from shiftlab.lab import Lab


def test_a_host_inherits_the_engine_and_not_the_device_table(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SHIFT_TCP_ENGINE", "native")
    monkeypatch.setenv("SHIFT_TCP_DEVICES", "x=lo")
    env = Lab("envt", hosts=1, nics=1, run_root=tmp_path).host_env("h0")
    assert env["SHIFT_TCP_ENGINE"] == "native"
    assert "SHIFT_TCP_DEVICES" not in env
    assert env["SHIFT_HOST"] == "h0"
