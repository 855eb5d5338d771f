"""The C core's own unit tests (libshift/core/tests/test_core.c), under AddressSanitizer and UBSan."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from native_build import CORE, SANITIZE, build, core_sources, fast_sources, sanitizer_reports


def test_core_unit_tests_pass_under_asan_and_ubsan(tmp_path: Path) -> None:
    sources = core_sources() + fast_sources()
    binary = build("gcc", CORE / "tests" / "test_core.c", tmp_path / "test_core", SANITIZE, sources)
    env = {
        **os.environ,
        "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0",
        "UBSAN_OPTIONS": "print_stacktrace=1",
    }
    result = subprocess.run([str(binary)], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith(" 0 failed"), result.stdout
    assert sanitizer_reports(result.stderr) == [], result.stderr
