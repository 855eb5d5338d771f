"""Builds of the C core outside the package build: the sanitizer build of its unit tests, the fuzz target.

`python tests/core/native_build.py OUT` builds the verbs backend's test binary (test_verbs.c) into OUT: make
test-rxe builds it on the host before the Soft-RoCE VM boots, which sees the host's files (the same
compiler and libraries) and would take minutes for it under TCG."""

from __future__ import annotations

import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "libshift" / "core"
SANITIZE = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=all"]
FLAGS = ["-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror", "-g", "-O1", f"-I{CORE}"]
BUILD_TIMEOUT = 600  # one compiler run: the Soft-RoCE VM runs them ten times slower than the host
# what a sanitizer prints when it finds something (some reports do not change the exit status)
REPORTS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:", "ERROR: libFuzzer")


def core_sources() -> list[Path]:
    """The tcp engine's C files (not the verbs backend's, nor the fast path's, nor what Cython makes of
    the .pyx files): every build under the Soft-RoCE VM's TCG has a file fewer to compile."""
    return sorted(p for p in CORE.glob("*.c") if not p.name.startswith(("_", "verbs", "fast")))


def fast_sources() -> list[Path]:
    """The fast path of shift QPs (fastpath.h), over either backend's table."""
    return sorted(CORE.glob("fast_*.c"))


def verbs_sources() -> list[Path]:
    """The verbs backend's C files (verbs_core.h)."""
    return sorted(CORE.glob("verbs*.c"))


def build(
    compiler: str, main: Path, out: Path, sanitize: list[str], sources: list[Path] | None = None
) -> Path:
    """Compile `main` with the core (or `sources`) into `out`, a file per job on two cores (a build under
    the Soft-RoCE VM's TCG takes minutes); skips the test when the compiler is missing."""
    if shutil.which(compiler) is None:
        pytest.skip(f"{compiler} is missing (scripts/ensure-system-deps.sh installs it)")
    files = [main, *(core_sources() if sources is None else sources)]
    objects = [out.parent / f"{out.name}.{i}.o" for i in range(len(files))]

    def compile_one(source: Path, obj: Path) -> subprocess.CompletedProcess[str]:
        argv = [compiler, *FLAGS, *sanitize, "-c", str(source), "-o", str(obj)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT)

    with ThreadPoolExecutor(max_workers=2) as pool:
        for result in pool.map(compile_one, files, objects):
            assert result.returncode == 0, result.stderr
    argv = [compiler, *sanitize, *map(str, objects), "-lpthread", "-o", str(out)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    assert result.returncode == 0, result.stderr
    return out


def sanitizer_reports(text: str) -> list[str]:
    return [line for line in text.splitlines() if any(report in line for report in REPORTS)]


def verbs_test(out: Path) -> Path:
    """The verbs backend's C unit tests (test_verbs.c) with both backends, under ASan and UBSan."""
    out.parent.mkdir(parents=True, exist_ok=True)
    return build("gcc", CORE / "tests" / "test_verbs.c", out, SANITIZE, core_sources() + verbs_sources())


if __name__ == "__main__":
    print(verbs_test(Path(sys.argv[1]).resolve()))
