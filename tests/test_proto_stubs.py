"""The committed stubs in libshift/api must be what `make proto` generates from proto/."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _genproto():
    spec = importlib.util.spec_from_file_location("genproto", ROOT / "scripts" / "genproto.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_stubs_match_protos(tmp_path):
    written = _genproto().generate(tmp_path)
    assert written, "no stubs generated"
    fresh = {p.name: p.read_text() for p in (tmp_path / "shift" / "v1").iterdir()}
    committed_dir = ROOT / "libshift" / "api" / "shift" / "v1"
    committed = {p.name: p.read_text() for p in committed_dir.iterdir() if p.is_file()}
    stale = sorted(name for name in fresh.keys() | committed.keys() if fresh.get(name) != committed.get(name))
    assert not stale, f"stubs out of date, run `make proto`: {stale}"


def test_every_service_has_its_stub():
    from libshift.api.shift.v1 import admin_pb2_grpc, agent_pb2_grpc

    assert hasattr(agent_pb2_grpc, "AgentStub")
    assert hasattr(admin_pb2_grpc, "AdminStub")
