"""libFuzzer on the C core's parsers of bytes from outside, for a bounded time each from its committed seed
corpus (libshift/core/fuzz/corpus/TARGET): the frame parser and responder (fuzz_responder.c: a hostile
peer's stream) and the link watch's parser (fuzz_linkwatch.c: rtnetlink datagrams, seeded with the kernel's
own). Any crash, hang, sanitizer report, stray write or broken invariant fails the test."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from native_build import CORE, SANITIZE, build, sanitizer_reports

# each target's time in the suite (from its seed corpus, so a regression of a known input is found at once);
# a longer campaign: SHIFT_FUZZ_SECONDS=3600
FUZZ_SECONDS = int(os.environ.get("SHIFT_FUZZ_SECONDS", "15"))

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("target", ["responder", "linkwatch"])
def test_fuzzing_finds_nothing(tmp_path: Path, target: str) -> None:
    binary = build(
        "clang",
        CORE / "fuzz" / f"fuzz_{target}.c",
        tmp_path / f"fuzz_{target}",
        [*SANITIZE, "-fsanitize=fuzzer"],
    )
    corpus = tmp_path / "corpus"
    shutil.copytree(CORE / "fuzz" / "corpus" / target, corpus)  # new inputs go here, not into the tree
    # the limit is on the peak RSS the kernel reports, which a child inherits from the process that forked
    # it (pytest's, with the suite's memory in it): 2048 failed at once after a test of 1.5 GiB
    argv = [str(binary), f"-max_total_time={FUZZ_SECONDS}", "-timeout=10", "-rss_limit_mb=6144", str(corpus)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=FUZZ_SECONDS + 120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert sanitizer_reports(result.stderr) == [], result.stderr[-4000:]
    assert "Done" in result.stderr, result.stderr[-4000:]
