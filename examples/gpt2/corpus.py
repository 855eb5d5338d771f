"""The training text and a fixed data order.

Batches depend only on (seed, step, rank): the windows of step s are drawn from a generator seeded
with (seed, s), the global batch is split by rank. So a run that slows down, pauses or fails over
sees exactly the data of a run that does not, which is what makes final weights comparable bitwise.
"""

from __future__ import annotations

from pathlib import Path

import torch

CORPUS = Path(__file__).with_name("corpus.txt")


def load(path: Path = CORPUS) -> torch.Tensor:
    """The corpus as a 1-D tensor of byte values (int64, ready for nn.Embedding)."""
    data = path.read_bytes()
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.int64)


def batch(
    data: torch.Tensor, *, seed: int, step: int, rank: int, world: int, per_rank: int, block: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's share (inputs, next-byte targets) of step `step`'s global batch."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, len(data) - block - 1, (world * per_rank,), generator=gen)
    mine = starts[rank * per_rank : (rank + 1) * per_rank]
    x = torch.stack([data[s : s + block] for s in mine.tolist()])
    y = torch.stack([data[s + 1 : s + 1 + block] for s in mine.tolist()])
    return x, y
