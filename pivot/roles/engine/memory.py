"""Resident memory of an engine's process tree, measured around a shift down (sec. 5.2).

Releasing the KV cache and the weights themselves (vLLM's CPU build has no sleep mode:
storages are resized to zero, the packed ``cpu_linear`` closures dropped and repacked) is
a workaround of vLLM's internals and lives in ``pivot.compat.vllm``.
"""

from __future__ import annotations

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
