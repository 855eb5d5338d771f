"""The verbs backend's C unit tests (libshift/core/tests/test_verbs.c) on two real devices, RC between
them, under AddressSanitizer and UBSan; and that the backend is built without linking libibverbs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from native_build import CORE, SANITIZE, build, sanitizer_reports, verbs_sources
from verbs_devices import verbs_pair

# libibverbs and its providers are not built with ASan: what they keep for the process's life is not ours
LEAKS = "leak:libibverbs.so\nleak:libibverbs/\nleak:librxe\n"


def test_rc_between_two_devices_under_asan_and_ubsan(tmp_path: Path) -> None:
    a, b = verbs_pair()
    binary = build("gcc", CORE / "tests" / "test_verbs.c", tmp_path / "test_verbs", SANITIZE, verbs_sources())
    suppressions = tmp_path / "lsan.supp"
    suppressions.write_text(LEAKS)
    env = {
        **os.environ,
        "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0",
        "LSAN_OPTIONS": f"suppressions={suppressions}",
        "UBSAN_OPTIONS": "print_stacktrace=1",
    }
    argv = [str(binary), a.name, str(a.gid_index), b.name, str(b.gid_index)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith(" 0 failed"), result.stdout
    assert sanitizer_reports(result.stderr) == [], result.stderr
