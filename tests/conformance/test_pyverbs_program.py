"""A pyverbs RC program (pyverbs_rc_program.py) runs on libshift with nothing changed but its imports.

On the tcp provider the two QPs reach each other by GID and QPN alone across the lab's two hosts; on the
verbs provider (the Soft-RoCE VM) the same file runs on libshift and then, its import lines turned back
into pyverbs' (the module each replaces is named in the line's comment), on Debian's pyverbs itself.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from libshift.providers.verbs.gid import ETHERNET, choose_gid, read_gid_table
from shiftlab.rxe.network import SYSFS_IB

PROGRAM = Path(__file__).with_name("pyverbs_rc_program.py")
SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's, with its pyverbs
IMPORT = re.compile(r"^from libshift\.verbs import (?P<names>.+?)  # (?P<module>pyverbs[\w.]*)$", re.M)


def as_pyverbs(text: str) -> str:
    """The program with each libshift import line turned into the pyverbs one its comment names."""
    return IMPORT.sub(lambda m: f"from {m['module']} import {m['names']}", text)


def gid_index(device: str) -> int:
    """The GID index libshift's verbs provider uses on the device (RoCE v2, IPv4): the program's too."""
    return choose_gid(read_gid_table(Path("/sys"), device, 1), ETHERNET).index


def run(python: str, program: Path, devices: tuple[str, str], gid_index: int) -> list[str]:
    result = subprocess.run(
        [python, str(program), *devices, str(gid_index)],
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.splitlines()


def check(lines: list[str]) -> list[int]:
    assert lines[:2] == ["received hello over RC", "written written in place"]
    assert lines[2].startswith("qpns ")
    return [int(n) for n in lines[2].split()[1:]]


def test_the_program_names_only_pyverbs_modules_in_its_import_lines():
    text = PROGRAM.read_text()
    converted = as_pyverbs(text)
    assert "libshift" not in converted.split('"""', 2)[2]  # every libshift import had its pyverbs module
    assert converted.count("from pyverbs") == 8
    program_lines = [line for line in text.splitlines() if not line.startswith("from libshift.verbs import")]
    assert program_lines == [line for line in converted.splitlines() if not line.startswith("from pyverbs")]


def test_a_pyverbs_rc_program_runs_on_libshift(fabric, tmp_path):
    devices = fabric.devices
    verbs = (SYSFS_IB / devices[0]).exists()
    index = gid_index(devices[0]) if verbs else 0
    qpns = check(run(sys.executable, PROGRAM, devices, index))
    if not verbs:  # tcp: each QPN names its context's listener (port << 8 | index)
        assert all(qpn >> 8 >= 1024 for qpn in qpns)
        return
    original = tmp_path / "pyverbs_rc_program.py"
    original.write_text(as_pyverbs(PROGRAM.read_text()))
    check(run(SYSTEM_PYTHON, original, devices, index))
