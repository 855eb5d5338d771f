"""Soft-RoCE in a VM: boot Debian's stock kernel (which has rdma_rxe) under QEMU and run a command there.

The guest sees the host's `/` read-only over 9p (so this tree, the venv, rdma-core and pyverbs are there as
on the host) and a temporary directory read-write (the job, the command's output and exit code). Inside,
`guest.py` builds two veth pairs with an rxe device on each end (see `network.py`), checks them with
perftest, runs the command and powers off. `python -m shiftlab.rxe run -- CMD...` is the CLI.

    host.py     the host's prerequisites: packages, kernel, initramfs, accelerator
    vm.py       one VM run: work dir, QEMU, console, timeouts, results, clean-up
    init.sh     the guest's init (mounts, then guest.py, then power off)
    guest.py    inside the guest: the rxe fabric, the sanity check, the command
    network.py  the guest's veth pairs, addresses, policy routing and rxe devices
"""

from shiftlab.rxe.host import RxeError
from shiftlab.rxe.vm import Job, run

__all__ = ["Job", "RxeError", "run"]
