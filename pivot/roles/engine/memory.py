"""Resident memory of an engine's process tree, measured around a shift down (sec. 5.2).

Releasing the KV cache and the weights themselves (vLLM's CPU build has no sleep mode:
storages are resized to zero, the packed ``cpu_linear`` closures dropped and repacked) is
a workaround of vLLM's internals and lives in ``pivot.compat.vllm``; the engine's sleep
(``pivot.roles.engine.sleep``) then returns the freed heap to the OS (``trim_heap``).
"""

from __future__ import annotations

import ctypes
import os


def process_rss(pid: int | str = "self") -> int:
    """Resident bytes of one process (``/proc/<pid>/statm``)."""
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def tree_pids(root: int) -> list[int]:
    """``root`` and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def tree_rss(root: int) -> tuple[int, dict[int, int]]:
    """Total resident bytes of ``root`` and its descendants, and the per-pid split."""
    per: dict[int, int] = {}
    for p in tree_pids(root):
        try:
            per[p] = process_rss(p)
        except OSError:
            continue
    return sum(per.values()), per


def trim_heap() -> bool:
    """Hands the C heap's free pages back to the OS (glibc ``malloc_trim(0)``); returns
    whether it ran (False without glibc).

    A released storage's bytes go back to glibc's malloc, which keeps chunks below its mmap
    threshold in the heap, and raises that threshold to the size of each mmapped chunk
    freed: a KV cache released and re-allocated once comes back from the heap, and the
    next release lowers resident memory by nothing. ``malloc_trim`` returns the free pages
    of every arena (about 1-2 ms here).
    """
    global _LIBC
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL("libc.so.6")
            _LIBC.malloc_trim  # noqa: B018 - glibc only
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC is False:
        return False
    _LIBC.malloc_trim(0)
    return True


_LIBC = None
