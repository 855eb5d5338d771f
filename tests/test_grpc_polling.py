"""libshift imports gRPC with the client polling it chose (libshift/grpc_polling.py), and only then.

Each case runs in a fresh interpreter: gRPC reads GRPC_EXPERIMENTS once per process.
"""

import os
import subprocess
import sys

import pytest

import libshift.grpc_polling

MODULE = libshift.grpc_polling.__file__


def run(code: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    return subprocess.run(
        [sys.executable, "-c", code], env=clean | env, capture_output=True, text=True, timeout=60, check=True
    )


def test_libshift_imports_grpc_with_the_setting_and_takes_the_variable_away() -> None:
    code = (
        "import os, sys, libshift; print(libshift.GRPC_READS_ON_THE_WAITING_THREAD,"
        " 'grpc' in sys.modules, os.environ.get('GRPC_EXPERIMENTS'))"
    )
    out = run(code)
    assert out.stdout.split() == ["True", "True", "None"]


def test_grpc_reads_the_setting_while_libshift_imports_it() -> None:
    # a name gRPC lacks makes it log an error as it reads the variable: proof that it read ours
    code = (  # the module alone: importing the libshift package would import gRPC first
        f"import importlib.util as u; s = u.spec_from_file_location('p', {MODULE!r});"
        " p = u.module_from_spec(s); s.loader.exec_module(p); p.SETTING = '-no_such_experiment_shift_test';"
        " print(p.read_on_the_waiting_thread())"
    )
    out = run(code)
    assert out.stdout.strip() == "True"
    assert "no_such_experiment_shift_test" in out.stderr


@pytest.mark.parametrize(
    ("code", "env"),
    [
        ("import grpc, libshift; print(libshift.GRPC_READS_ON_THE_WAITING_THREAD)", {}),
        ("import libshift; print(libshift.GRPC_READS_ON_THE_WAITING_THREAD)", {"GRPC_EXPERIMENTS": ""}),
    ],
    ids=["grpc-imported-first", "user-set-GRPC_EXPERIMENTS"],
)
def test_grpc_is_left_alone_when_libshift_comes_too_late_or_the_user_chose(code: str, env: dict) -> None:
    assert run(code, **env).stdout.strip() == "False"
