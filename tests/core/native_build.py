"""Builds of the C core outside the package build: the sanitizer build of its unit tests, the fuzz target."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "libshift" / "core"
SANITIZE = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=all"]
FLAGS = ["-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror", "-g", "-O1", f"-I{CORE}"]
# what a sanitizer prints when it finds something (some reports do not change the exit status)
REPORTS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:", "ERROR: libFuzzer")


def core_sources() -> list[Path]:
    """The core's C files (not _core.c, which Cython makes of _core.pyx)."""
    return sorted(p for p in CORE.glob("*.c") if p.name != "_core.c")


def build(compiler: str, main: Path, out: Path, sanitize: list[str]) -> Path:
    """Compile `main` with the core into `out`; skips the test when the compiler is missing."""
    if shutil.which(compiler) is None:
        pytest.skip(f"{compiler} is missing (scripts/ensure-system-deps.sh installs it)")
    argv = [compiler, *FLAGS, *sanitize, str(main), *map(str, core_sources()), "-lpthread", "-o", str(out)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return out


def sanitizer_reports(text: str) -> list[str]:
    return [line for line in text.splitlines() if any(report in line for report in REPORTS)]
