"""Who may import whom (DESIGN section 2), as far as the lab and the daemon go.

shiftd takes from libshift only the generated stubs and the two small shared modules, which need nothing but
the standard library; neither shiftd nor libshift imports the lab.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
SHARED = {"libshift.gid", "libshift.devicetable"}


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return names | {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}


def package_imports(package: str) -> dict[Path, set[str]]:
    return {path: imports(path) for path in sorted((ROOT / package).rglob("*.py"))}


def test_shiftd_takes_only_the_stubs_and_the_shared_modules_from_libshift() -> None:
    for path, names in package_imports("shiftd").items():
        library = {n for n in names if n == "libshift" or n.startswith("libshift.")}
        assert all(n in SHARED or n.startswith("libshift.api") for n in library), (path, library)


@pytest.mark.parametrize("module", sorted(SHARED))
def test_a_shared_module_needs_only_the_standard_library(module: str) -> None:
    path = ROOT / (module.replace(".", "/") + ".py")
    assert imports(path) <= {"__future__", "dataclasses", "ipaddress", "re"}, module


@pytest.mark.parametrize("package", ["shiftd", "libshift"])
def test_nothing_below_the_lab_imports_it(package: str) -> None:
    for path, names in package_imports(package).items():
        assert not any(n == "shiftlab" or n.startswith("shiftlab.") for n in names), path


def test_libshift_netns_needs_nothing_of_the_library() -> None:
    """The tcp provider opens sockets through it: importing the verbs from it would close a circle."""
    assert not any(n.startswith("libshift") for n in imports(ROOT / "libshift" / "netns.py"))
