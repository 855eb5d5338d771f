"""libshift.collectives: ring all-reduce, broadcast, all-gather, reduce-scatter and barrier over ShiftQPs.

`Communicator(store, rank, world_size)` on every rank, with a `Store` the ranks share (`FileStore(dir)`, or
a torch.distributed store); arrays are numpy arrays or CPU tensors. See docs/collectives.md.
"""

from libshift.collectives.communicator import Communicator
from libshift.collectives.device import pick_device
from libshift.collectives.errors import CollectiveError, NoPathLeft
from libshift.collectives.ops import ReduceOp
from libshift.collectives.store import FileStore, Store

__all__ = ["CollectiveError", "Communicator", "FileStore", "NoPathLeft", "ReduceOp", "Store", "pick_device"]
