"""A short ping-pong over the C core is clean under valgrind's memcheck (valgrind_pingpong.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from memcheck import clean, memcheck

PINGPONG = Path(__file__).with_name("valgrind_pingpong.py")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


def test_a_ping_pong_is_memcheck_clean(tmp_path: Path) -> None:
    log = tmp_path / "memcheck.log"
    env = {**os.environ, "SHIFT_TCP_DEVICES": "vg_lo=lo"}
    argv = [*memcheck(log), sys.executable, str(PINGPONG)]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr + log.read_text()
    assert result.stdout.strip() == "ok"
    assert clean(log), log.read_text()
