"""The torch.distributed backend "shift": collectives over libshift's failover-protected verbs.

An ordinary script needs only `torch.distributed.init_process_group(backend="shift")` (or "cpu:shift"):
torch imports the entry points of the group `torch.backends` when it is itself imported, and ours calls
`register()`. Importing this module registers too, for environments where autoload is switched off
(TORCH_DEVICE_BACKEND_AUTOLOAD=0). Both stay cheap: the communicator is imported only when a group is made.
See docs/torch.md.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch.distributed as dist

BACKEND = "shift"


def register() -> None:
    """Make "shift" a torch.distributed backend for CPU tensors; calling it again does nothing.

    torch is imported here, not at the top: when this module is imported before torch, importing torch
    runs the entry point, which calls back into this module while it is still being imported.
    """
    import torch.distributed as dist

    if BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])


def _create(store: dist.Store, rank: int, world_size: int, timeout: timedelta) -> dist.ProcessGroup:
    """torch's hook for a new group: the store is the group's own (torch prefixes it with the group name)."""
    from libshift.torch.process_group import ShiftProcessGroup

    return ShiftProcessGroup(store, rank, world_size, timeout)


register()
