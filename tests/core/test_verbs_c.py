"""The verbs backend's C unit tests (libshift/core/tests/test_verbs.c) under AddressSanitizer and UBSan: the
data path table over the tcp engine anywhere, and with two real devices RC between them and the table over
verbs too."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from native_build import sanitizer_reports, verbs_test
from verbs_devices import verbs_pair

# libibverbs and its providers are not built with ASan: what they keep for the process's life is not ours
LEAKS = "leak:libibverbs.so\nleak:libibverbs/\nleak:librxe\n"


@pytest.fixture(scope="module")
def binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built once for both tests; in make test-rxe's VM, on the host before it booted (a build under TCG
    takes minutes: 118 s of the VM's 487 on an idle machine, and more beside the host's suite)."""
    prebuilt = os.environ.get("SHIFT_TEST_VERBS_BINARY")
    if prebuilt:
        assert Path(prebuilt).is_file(), f"SHIFT_TEST_VERBS_BINARY={prebuilt}: no such file"
        return Path(prebuilt)
    return verbs_test(tmp_path_factory.mktemp("verbs") / "test_verbs")


def run(binary: Path, tmp_path: Path, *args: str) -> None:
    """Runs the test binary; it must pass every check with no sanitizer report."""
    suppressions = tmp_path / "lsan.supp"
    suppressions.write_text(LEAKS)
    env = {
        **os.environ,
        "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0",
        "LSAN_OPTIONS": f"suppressions={suppressions}",
        "UBSAN_OPTIONS": "print_stacktrace=1",
    }
    result = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith(" 0 failed"), result.stdout
    assert sanitizer_reports(result.stderr) == [], result.stderr


def test_the_data_path_table_over_tcp(binary: Path, tmp_path: Path) -> None:
    run(binary, tmp_path)


@pytest.mark.soft_roce  # in make test-rxe's VM, on rxe0 and rxe1
def test_rc_between_two_devices_and_the_table_over_verbs(binary: Path, tmp_path: Path) -> None:
    a, b = verbs_pair()
    run(binary, tmp_path, a.name, str(a.gid_index), b.name, str(b.gid_index))
