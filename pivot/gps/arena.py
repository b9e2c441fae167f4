"""The arena files of GPS host stores in ``/dev/shm`` (paper sec. 5.1, appendix B.1).

One file per stored (or staged) version of a model on a host, named
``pivot-gps-p<pid>-<tag>-h<host>-<model>-a<n>``, so files a dead process left behind are
recognised and swept by the next store on that machine.
"""

from __future__ import annotations

import logging
import os
import re

import torch

logger = logging.getLogger(__name__)


def map_arena(path: str, nbytes: int) -> torch.Tensor:
    """Maps an arena file shared (writes reach the file; no copy is made)."""
    return torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _unlink_all(paths: set[str]) -> None:
    for p in list(paths):
        _unlink(p)


_STALE = re.compile(r"^pivot-gps-p(\d+)-")


def sweep_stale_arenas(shm_dir: str) -> int:
    """Removes arena files whose owning process no longer exists (it died without
    closing its store); returns how many. Files of live processes are left alone."""
    n = 0
    try:
        names = os.listdir(shm_dir)
    except FileNotFoundError:
        return 0
    for name in names:
        m = _STALE.match(name)
        if not m:
            continue
        try:
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            _unlink(os.path.join(shm_dir, name))
            n += 1
        except PermissionError:
            pass
    if n:
        logger.info("removed %d stale GPS arena files from %s", n, shm_dir)
    return n
