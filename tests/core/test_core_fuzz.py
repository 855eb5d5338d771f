"""libFuzzer on the C core's frame parser and responder (libshift/core/fuzz/fuzz_responder.c), for a bounded
time from the committed seed corpus: any crash, hang, sanitizer report or stray write fails the test."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from native_build import CORE, SANITIZE, build, sanitizer_reports

FUZZ_SECONDS = 30

pytestmark = pytest.mark.slow


def test_fuzzing_the_responder_finds_nothing(tmp_path: Path) -> None:
    binary = build(
        "clang",
        CORE / "fuzz" / "fuzz_responder.c",
        tmp_path / "fuzz_responder",
        [*SANITIZE, "-fsanitize=fuzzer"],
    )
    corpus = tmp_path / "corpus"
    shutil.copytree(CORE / "fuzz" / "corpus", corpus)  # new inputs go here, not into the tree
    argv = [str(binary), f"-max_total_time={FUZZ_SECONDS}", "-timeout=10", "-rss_limit_mb=2048", str(corpus)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=FUZZ_SECONDS + 120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert sanitizer_reports(result.stderr) == [], result.stderr[-4000:]
    assert "Done" in result.stderr, result.stderr[-4000:]
