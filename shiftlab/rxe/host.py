"""The host's side of the VM's prerequisites: Debian packages, the kernel, the initramfs, the accelerator.

Everything missing is installed with apt-get (one `apt-get update` first) unless the caller forbids it;
then a missing piece is a one-line RxeError naming it. The kernel is the one Debian's `linux-image-amd64`
depends on (its name moves with security updates, so it is looked up, never written down here).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# what the guest runs: QEMU on the host; rdma-core, the rxe provider, pyverbs and perftest in the guest
# (the guest's root is the host's, so they are installed here)
PACKAGES = (
    "qemu-system-x86",
    "qemu-utils",
    "rdma-core",
    "ibverbs-providers",
    "ibverbs-utils",
    "python3-pyverbs",
    "perftest",
    "busybox-static",  # virtme-mkinitramfs puts it in the initramfs
)
KERNEL_META = "linux-image-amd64"
QEMU = "qemu-system-x86_64"
MKINITRAMFS = "virtme-mkinitramfs"  # PyPI virtme-ng

Log = Callable[[str], None]


class RxeError(Exception):
    """Something the VM needs is missing or did not work; the message is one line that says what."""


@dataclass(frozen=True)
class Kernel:
    version: str  # 6.1.0-57-amd64
    image: Path  # /boot/vmlinuz-<version>


def missing_packages(names: tuple[str, ...]) -> list[str]:
    """The Debian packages among `names` that dpkg does not have installed."""
    result = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Package} ${db:Status-Abbrev}\n", *names],
        capture_output=True,
        text=True,
    )
    installed = {line.split()[0] for line in result.stdout.splitlines() if line.split()[1:2] == ["ii"]}
    return [name for name in names if name not in installed]


def kernel_package() -> str:
    """The concrete kernel package Debian's linux-image-amd64 depends on now (linux-image-6.1.0-57-amd64)."""
    try:
        result = subprocess.run(["apt-cache", "depends", KERNEL_META], capture_output=True, text=True)
    except FileNotFoundError:
        raise RxeError("no kernel: apt-cache is missing, so the Debian kernel cannot be looked up") from None
    found = depended_kernel(result.stdout)
    if result.returncode != 0 or found is None:
        raise RxeError(f"no kernel: `apt-cache depends {KERNEL_META}` names none ({_tail(result)})")
    return found


def depended_kernel(depends: str) -> str | None:
    """The kernel package in `apt-cache depends linux-image-amd64`'s answer."""
    found = re.search(r"Depends:\s*(linux-image-\S+)", depends)
    return found.group(1) if found else None


def ensure_packages(install: bool, log: Log) -> Kernel:
    """Install what is missing (when allowed) and return the kernel to boot."""
    if shutil.which("dpkg-query") is None:
        raise RxeError("not a Debian host (no dpkg-query): install QEMU, rdma-core and a kernel by hand")
    kernel = kernel_package()
    missing = missing_packages((*PACKAGES, kernel))
    if missing and not install:
        raise RxeError(f"missing packages (installing was not allowed): {' '.join(missing)}")
    if missing:
        log(f"installing {' '.join(missing)}")
        _apt(["update", "-q"])
        _apt(["install", "-y", "-q", "--no-install-recommends", *missing])
    return installed_kernel(kernel.removeprefix("linux-image-"))


def installed_kernel(version: str) -> Kernel:
    image = Path(f"/boot/vmlinuz-{version}")
    if not image.exists():
        raise RxeError(f"no kernel: {image} is missing (package linux-image-{version})")
    if not list(Path(f"/lib/modules/{version}/kernel/drivers/infiniband/sw/rxe").glob("rdma_rxe.ko*")):
        raise RxeError(f"kernel {version} has no rdma_rxe module")
    return Kernel(version, image)


def _apt(args: list[str]) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    result = subprocess.run(["apt-get", *args], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise RxeError(f"apt-get {' '.join(args)} failed: {_tail(result)}")


def qemu() -> str:
    path = shutil.which(QEMU)
    if path is None:
        raise RxeError(f"no qemu: {QEMU} is not on PATH (Debian package qemu-system-x86)")
    return path


def make_initramfs(kernel: Kernel, outfile: Path) -> None:
    """An initramfs (virtme-ng's) that mounts the 9p share tagged /dev/root as the root file system."""
    tool = shutil.which(MKINITRAMFS, path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    if tool is None:
        raise RxeError(f"no {MKINITRAMFS}: pip install the test extra (virtme-ng) into this venv")
    result = subprocess.run(
        [tool, "--mod-kversion", kernel.version, "--outfile", str(outfile)], capture_output=True, text=True
    )
    if result.returncode != 0:
        raise RxeError(f"{MKINITRAMFS} failed: {_tail(result)}")


def hardware_virtualization(cpuinfo: str) -> bool:
    """Whether the CPU flags show VT-x or AMD-V. Without them /dev/kvm may still exist (a paravirtual KVM,
    on which a stock kernel hangs at boot), so /dev/kvm alone proves nothing."""
    return any(re.search(r"^flags\s*:.*\b(vmx|svm)\b", line) for line in cpuinfo.splitlines())


def kvm_candidate() -> bool:
    """KVM is worth a probe boot: /dev/kvm is usable and the CPU has hardware virtualization."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return os.access("/dev/kvm", os.R_OK | os.W_OK) and hardware_virtualization(cpuinfo)


def _tail(result: subprocess.CompletedProcess[str]) -> str:
    lines = (result.stderr or result.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit status {result.returncode}"
