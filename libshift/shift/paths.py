"""The paths of a resilient QP: the default device's, then its backups' in the order the policy gives.

A path is named here once, because the name travels: in the ledger (where a WR is posted), between the peers
(a control message names the path it is about by its index) and in the notification targets a QP
advertises. The first backup is the one a failure of the default NIC moves to; each further one is the
backup of the one before, where a failure of that one moves on to.
"""

from __future__ import annotations

PRIMARY, BACKUP = "primary", "backup"
MAX_PATHS = 8  # the default and up to 7 backups: the NICs of the largest hosts
PATHS = (PRIMARY, BACKUP, *(f"backup{i}" for i in range(2, MAX_PATHS)))


def depth(path: str) -> int:
    """0 for the default path, 1 for the backup, 2 for the backup's backup, ..."""
    return PATHS.index(path)
