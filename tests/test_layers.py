"""The floor plan of DESIGN.md section 2, checked on the source: who may import whom.

Every import statement counts, at module level or inside a function, under TYPE_CHECKING or not: an
annotation-only import that points up is still an arrow up. The graph is read with ast, so nothing is
imported to check it.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("libshift", "shiftd", "shiftlab")

# libshift's floors, lowest first: a module may import its own floor or one below it, never one above.
# The shared floor is what shiftd may use besides the generated stubs: stdlib-only modules both sides need.
LIBSHIFT_FLOORS: list[tuple[str, ...]] = [
    ("libshift.api",),
    ("libshift.gid", "libshift.devicetable"),
    ("libshift.vocabulary", "libshift.notices", "libshift.netns"),
    ("libshift.grpc_polling",),
    ("libshift.core",),
    ("libshift.providers",),
    ("libshift.device",),
    ("libshift.verbs", "libshift.agent", "libshift.published", "libshift.reportqueue"),
    ("libshift.shift", "libshift.perf"),
    ("libshift.collectives",),
    ("libshift.torch",),
]
SHARED_WITH_SHIFTD = ("libshift.api", "libshift.gid", "libshift.devicetable")
# the one place shiftd uses the library proper: it reads the RDMA devices' async events through the verbs
# provider's reader of them (one implementation of opening a device and waiting on its events, not two)
SHIFTD_EVENT_READER = ("shiftd.async_events", ("libshift.providers.verbs", "libshift.vocabulary.errors"))
# the package's own __init__ imports the gRPC polling choice first, for every importer (grpc_polling.py)
PACKAGE_INIT_IMPORTS = {"libshift": {"libshift.grpc_polling"}}
LONG_MODULE_LINES = 400
LONG_MODULE_REASON = "Long on purpose:"


def module_files() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


MODULES = module_files()


def owner(name: str) -> str | None:
    """The module of ours that an imported dotted name lands in (a package's __init__ for a package)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imported_names(module: str, path: Path) -> set[str]:
    is_package = path.name == "__init__.py"
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            names.add(target)
            names.update(f"{target}.{alias.name}" for alias in node.names)
    return names


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of ours it imports (the stubs under libshift.api count as one node)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in MODULES.items():
        if module.startswith("libshift.api."):
            continue
        for name in imported_names(module, path):
            target = owner(name)
            if target is None:
                continue
            if target.startswith("libshift.api"):
                target = "libshift.api"
            if target != module:
                graph[module].add(target)
    return graph


GRAPH = import_graph()


def floor_of(module: str) -> int | None:
    for index, floor in enumerate(LIBSHIFT_FLOORS):
        if any(module == top or module.startswith(f"{top}.") for top in floor):
            return index
    return None


def folder(module: str) -> str:
    """A module's room: the subpackage it sits in, or itself when it sits at the top of a package."""
    return ".".join(module.split(".")[:2])


def arrows(source_prefix: str) -> list[tuple[str, str]]:
    return [
        (module, target)
        for module, targets in GRAPH.items()
        if module == source_prefix or module.startswith(f"{source_prefix}.")
        for target in sorted(targets)
    ]


def test_every_libshift_module_has_a_floor() -> None:
    lost = [m for m in MODULES if m.startswith("libshift.") and floor_of(m) is None]
    assert not lost, f"modules on no floor of LIBSHIFT_FLOORS: {lost}"


def test_no_arrow_points_up_in_libshift() -> None:
    up = []
    for module, target in arrows("libshift"):
        if target in PACKAGE_INIT_IMPORTS.get(module, ()):
            continue
        if module == "libshift" or target == "libshift":
            continue
        source_floor, target_floor = floor_of(module), floor_of(target)
        if source_floor is not None and target_floor is not None and target_floor > source_floor:
            up.append(f"{module} -> {target}")
    assert not up, "imports pointing up a floor:\n" + "\n".join(up)


def test_libshift_imports_neither_the_daemon_nor_the_lab() -> None:
    bad = [f"{m} -> {t}" for m, t in arrows("libshift") if t.split(".")[0] in ("shiftd", "shiftlab")]
    assert not bad, "\n".join(bad)


def test_shiftd_uses_of_libshift_only_the_contract_and_the_shared_modules() -> None:
    reader, its_targets = SHIFTD_EVENT_READER
    bad = [
        f"{m} -> {t}"
        for m, t in arrows("shiftd")
        if t.split(".")[0] == "shiftlab"
        or (
            t.startswith("libshift")
            and t != "libshift"
            and t not in SHARED_WITH_SHIFTD
            and not (m == reader and t.startswith(its_targets))
        )
    ]
    assert not bad, "\n".join(bad)


# the library's own words, and the one module the tcp provider opens sockets through (importing the verbs
# from it would close a circle)
GROUND = ["libshift.gid", "libshift.devicetable", "libshift.vocabulary", "libshift.notices", "libshift.netns"]


@pytest.mark.parametrize("module", GROUND)
def test_the_ground_floor_imports_nothing_of_ours(module: str) -> None:
    bad = [f"{m} -> {t}" for m, t in arrows(module) if not (t == module or t.startswith(f"{module}."))]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("module", [m for m in SHARED_WITH_SHIFTD if m != "libshift.api"])
def test_a_module_shared_with_shiftd_needs_only_the_standard_library(module: str) -> None:
    tops = {name.split(".")[0] for name in imported_names(module, MODULES[module])} - {"__future__"}
    assert tops <= sys.stdlib_module_names, f"{module} imports {sorted(tops - sys.stdlib_module_names)}"


def test_the_failover_layer_speaks_no_protobuf() -> None:
    bad = [f"{m} -> {t}" for m, t in arrows("libshift.shift") if t == "libshift.api"]
    assert not bad, "\n".join(bad)


def test_the_tcp_provider_moves_no_bytes_of_its_own() -> None:
    """The C core is the tcp provider's one engine (docs/core.md): the provider reaches it, and has no event
    loop or thread of its own, in which a second data path would live."""
    assert ("libshift.providers.tcp.context", "libshift.core") in arrows("libshift.providers.tcp")
    own = {
        module: sorted(tops & {"select", "selectors", "threading", "asyncio"})
        for module in MODULES
        if module.startswith("libshift.providers.tcp")
        for tops in [{name.split(".")[0] for name in imported_names(module, MODULES[module])}]
    }
    assert not {m: loops for m, loops in own.items() if loops}, own


def test_no_circle_crosses_a_folder() -> None:
    edges: dict[str, set[str]] = defaultdict(set)
    for module, targets in GRAPH.items():
        for target in targets:
            if target in PACKAGE_INIT_IMPORTS.get(module, ()):
                continue
            a, b = folder(module), folder(target)
            if a != b and a not in PACKAGES and b not in PACKAGES:
                edges[a].add(b)
    circles = strongly_connected(edges)
    assert not circles, f"folders importing each other: {circles}"


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one node."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in list(edges):
        if node not in index:
            visit(node)
    return found


def test_a_long_library_module_says_why_at_its_top() -> None:
    long_ones = []
    for module, path in MODULES.items():
        if not module.startswith("libshift.") or module.startswith("libshift.api"):
            continue
        text = path.read_text()
        if text.count("\n") > LONG_MODULE_LINES:
            docstring = ast.get_docstring(ast.parse(text)) or ""
            if LONG_MODULE_REASON not in docstring:
                long_ones.append(f"{module} ({text.count(chr(10))} lines)")
    assert not long_ones, f"over {LONG_MODULE_LINES} lines with no '{LONG_MODULE_REASON}' line: {long_ones}"
