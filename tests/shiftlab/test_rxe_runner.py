"""The Soft-RoCE VM runner's host side (shiftlab.rxe), without a VM: a stand-in QEMU plays the guest.

The real boot is `make test-rxe` (minutes under TCG); here: the accelerator's detection, the kernel's
lookup, QEMU's command line, the results coming back, and the clear errors (no qemu, a boot that hangs)
with the QEMU process ended and the work share removed.
"""

from __future__ import annotations

import importlib.util
import io
import os
import signal
import textwrap
from pathlib import Path

import pytest

from shiftlab.rxe import host, vm
from shiftlab.rxe.guest import MARK
from shiftlab.rxe.host import Kernel, RxeError

# flags lines of /proc/cpuinfo, cut short: this machine's paravirtual KVM guest, and a VT-x host
PVM_FLAGS = "flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr hypervisor lahf_lm abm"
VTX_FLAGS = "flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr vmx smx est tm2 ssse3"


def test_kvm_is_a_candidate_only_with_vmx_or_svm():
    assert not host.hardware_virtualization(f"processor\t: 0\n{PVM_FLAGS}\n")
    assert host.hardware_virtualization(f"processor\t: 0\n{VTX_FLAGS}\n")
    assert host.hardware_virtualization(PVM_FLAGS.replace("abm", "abm svm"))


def test_the_kernel_is_the_one_linux_image_amd64_depends_on():
    answer = "linux-image-amd64\n  Depends: linux-image-6.1.0-57-amd64\n"
    assert host.depended_kernel(answer) == "linux-image-6.1.0-57-amd64"
    assert host.depended_kernel("linux-image-amd64\n") is None


def test_no_qemu_is_a_one_line_error(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(RxeError, match=r"^no qemu: qemu-system-x86_64 is not on PATH"):
        host.qemu()


def test_qemu_gets_the_root_read_only_the_work_share_and_tcg(tmp_path):
    argv = vm.qemu_argv("qemu", Kernel("6.1.0-57-amd64", Path("/boot/k")), tmp_path, "tcg", "4G", 2)
    assert argv[argv.index("-accel") + 1] == "tcg,thread=multi"
    assert "local,id=root,path=/,readonly=on,security_model=none,multidevs=remap" in argv
    assert f"local,id=work,path={tmp_path},security_model=none,multidevs=remap" in argv
    cmdline = argv[argv.index("-append") + 1].split()
    assert f"init={vm.INIT}" in cmdline and f"shiftlab.work={tmp_path}" in cmdline
    assert "-no-reboot" in argv  # a guest that panics ends QEMU rather than booting again


def fake_qemu(tmp_path: Path, guest: str) -> str:
    """An executable standing in for QEMU: runs `guest` (shell), $work read from the kernel command line."""
    script = tmp_path / "qemu"
    script.write_text(
        textwrap.dedent(f"""\
            #!/bin/sh
            work=$(echo "$@" | tr ' ' '\\n' | sed -n 's/^shiftlab\\.work=//p')
            echo $$ > {tmp_path}/qemu.pid
            """)
        + guest
    )
    script.chmod(0o755)
    return str(script)


@pytest.fixture
def runner(tmp_path, monkeypatch):
    """run(job) with the stand-in QEMU of `guest`, the prerequisites taken as present; the work share is
    made under tmp_path/shares so that the test can see it was removed."""
    monkeypatch.setattr(host, "ensure_packages", lambda install, log: Kernel("6.1.0-57-amd64", Path("/k")))
    monkeypatch.setattr(host, "make_initramfs", lambda kernel, outfile: outfile.write_bytes(b""))
    monkeypatch.setattr(host, "kvm_candidate", lambda: False)
    shares = tmp_path / "shares"
    shares.mkdir()
    monkeypatch.setattr(vm.tempfile, "tempdir", str(shares))
    progress: list[str] = []

    def run(guest: str, **job: object) -> tuple[int, bytes]:
        monkeypatch.setattr(host, "qemu", lambda: fake_qemu(tmp_path, guest))
        out = io.BytesIO()
        try:
            # cwd "/": the stand-in guest needs none
            rc = vm.run(vm.Job(**{"argv": ["true"], "cwd": "/", **job}), out, progress.append)
            return rc, out.getvalue()
        finally:
            assert list(shares.iterdir()) == []  # the work share is gone, however the run ended

    run.progress = progress  # type: ignore[attr-defined]
    return run


def test_the_trees_code_folders_are_compiled_here_for_the_read_only_guest(tmp_path):
    module, elsewhere = tmp_path / "tests" / "helper.py", tmp_path / "data" / "script.py"
    for path in (module, elsewhere):
        path.parent.mkdir()
        path.write_text("X = 1\n")
    vm._compile(tmp_path)
    assert Path(importlib.util.cache_from_source(str(module))).is_file()
    assert not (elsewhere.parent / "__pycache__").exists()  # only the code folders: not a venv's tree


def test_the_commands_output_and_exit_code_come_back(runner):
    guest = f"""\
        echo "{MARK}running true"
        printf 'line 1\\nline 2\\n' > "$work/output.log"
        echo '{{"rc": 3}}' > "$work/status.json"
        """
    rc, out = runner(textwrap.dedent(guest))
    assert (rc, out) == (3, b"line 1\nline 2\n")
    assert any(line.startswith("running true, ") for line in runner.progress)


def test_a_failure_in_the_guest_is_one_line(runner):
    error = '{"error": "RuntimeError: rdma link add failed"}'
    guest = f"""echo "{MARK}setting up"; echo '{error}' > "$work/status.json"\n"""
    with pytest.raises(RxeError, match=r"^in the guest: RuntimeError: rdma link add failed$"):
        runner(guest)


def test_a_boot_that_hangs_times_out_with_the_consoles_last_lines_and_qemu_ended(runner, tmp_path):
    guest = "echo 'Probing EDD (edd=off to disable)... ok'\nexec sleep 600\n"
    with pytest.raises(RxeError, match=r"^boot timeout: no init after \d+ s; console: Probing EDD") as err:
        runner(guest, boot_timeout=1.0)
    assert "\n" not in str(err.value)
    pid = int((tmp_path / "qemu.pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_guest_that_ends_without_a_result_says_so(runner):
    # the console's tail may begin with a line the test process's gRPC writes in the forked child before
    # exec (its fork handler): the panic is in the tail, not necessarily first
    ended = r"^the guest ended without a result; console: .*Kernel panic - not syncing"
    with pytest.raises(RxeError, match=ended):
        runner("echo 'Kernel panic - not syncing: Attempted to kill init!'\n")


def test_the_cli_turns_an_error_into_one_line_and_exit_125(monkeypatch, capsys):
    from shiftlab.rxe import __main__ as cli

    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.chdir("/")  # the checkout may be under /tmp, which the runner refuses first
    monkeypatch.setattr(host, "ensure_packages", lambda install, log: Kernel("6.1.0-57-amd64", Path("/k")))
    before = signal.getsignal(signal.SIGTERM)
    assert cli.main(["run", "--", "true"]) == cli.RUNNER_FAILED
    # the run's SIGTERM handler is gone with it: left in pytest's process, it made a SIGTERM to any child
    # forked from it (pyroute2's namespace helpers) raise SystemExit there and run the rest of the suite
    assert signal.getsignal(signal.SIGTERM) is before
    err = capsys.readouterr().err
    assert (
        err == f"shiftlab.rxe: error: no qemu: {host.QEMU} is not on PATH (Debian package qemu-system-x86)\n"
    )


def test_a_checkout_under_tmp_is_kept_visible_over_the_guests_own_tmp(monkeypatch):
    monkeypatch.setattr(vm, "CODE_ROOT", Path("/tmp/clone"))
    monkeypatch.setattr(vm.sys, "executable", "/tmp/clone/.venv/bin/python")
    job = vm.Job(argv=["/tmp/clone/.venv/bin/python", "-m", "pytest"], cwd="/tmp/clone")
    assert vm.kept_paths(job) == ["/tmp/clone"]  # the folders inside it come with it
    assert vm.kept_paths(vm.Job(argv=["true"], cwd="/run/x")) == ["/run/x", "/tmp/clone"]
    kernel = Kernel("6.1.0-57-amd64", Path("/boot/k"))
    cmdline = vm.qemu_argv("qemu", kernel, Path("/w"), "tcg", "4G", 2, ["/run/x", "/tmp/clone"])
    assert "shiftlab.keep=/run/x:/tmp/clone" in cmdline[cmdline.index("-append") + 1].split()


def test_a_command_directly_in_the_guests_own_tmp_is_refused_before_booting(runner):
    with pytest.raises(RxeError, match=r"^/tmp/x\.sh: the guest has its own /tmp"):
        runner("exit 1\n", argv=["/tmp/x.sh"])
