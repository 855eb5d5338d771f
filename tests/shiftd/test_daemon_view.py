"""The daemon offers the gRPC services everything DaemonView names, and server.py needs no more of it."""

import ast
from pathlib import Path

from daemon_harness import offline_daemon

import shiftd.server
from shiftd.daemon_view import DaemonView


def test_the_daemon_is_a_daemon_view(tmp_path: Path) -> None:
    assert isinstance(offline_daemon(tmp_path), DaemonView)


def test_the_services_use_the_daemon_only_through_the_view() -> None:
    """Every `self.daemon.X` and `daemon.X` in server.py is in DaemonView; daemon.py is not imported."""
    tree = ast.parse(Path(shiftd.server.__file__).read_text())
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            owner = node.value
            of_daemon = isinstance(owner, ast.Attribute) and owner.attr == "daemon"
            if of_daemon or (isinstance(owner, ast.Name) and owner.id == "daemon"):
                used.add(node.attr)
        if isinstance(node, ast.ImportFrom):
            assert node.module != "shiftd.daemon"
    members = {name for name in dir(DaemonView) if not name.startswith("_")} | set(DaemonView.__annotations__)
    assert used and used <= members, used - members
