"""Aligned device blocks of a host (sec. 5.2; docs/design.md): the arithmetic behind the planner's
``PivotPlanner.aligned_blocks`` option.

On GPUs a replica of k devices (TP, and EP for MoE GenRMs) fixes its parallel groups when
its engine starts, and its collectives want the k GPUs that share a host's fast links.
So under the option a replica of size k sits on an aligned block of one host: the
devices whose place within their host (``host_slots``) is in [j*k, (j+1)*k), for a j with
(j+1)*k <= the host's size. A block never straddles hosts, and shifts move whole blocks:
a role grows only onto blocks whose every device is freed.

A device's place within its host is its rank among that host's devices in id order, so
the usual layout (device d on host d // P) gives block j of host h the devices
[h*P + j*k, h*P + (j+1)*k), and interleaved host ids work the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pivot.errors import ConfigError


def host_devices(device_host: Sequence[int]) -> dict[int, list[int]]:
    """Host -> its devices in id order (hosts in ascending order)."""
    out: dict[int, list[int]] = {}
    for d, h in enumerate(device_host):
        out.setdefault(h, []).append(d)
    return dict(sorted(out.items()))


def host_slots(device_host: Sequence[int]) -> tuple[int, ...]:
    """Each device's place within its host: its rank among the host's devices by id."""
    slot = [0] * len(device_host)
    for devs in host_devices(device_host).values():
        for i, d in enumerate(devs):
            slot[d] = i
    return tuple(slot)


def aligned_blocks(device_host: Sequence[int], size: int) -> list[tuple[int, ...]]:
    """Every aligned block of ``size`` devices in the pool, host by host (ascending),
    then by j; a host of P devices holds P // size of them."""
    if size < 1:
        raise ValueError(f"block size must be >= 1, got {size}")
    return [tuple(devs[j * size:(j + 1) * size])
            for devs in host_devices(device_host).values()
            for j in range(len(devs) // size)]


def free_blocks(device_host: Sequence[int], size: int,
                free: Iterable[int]) -> list[tuple[int, ...]]:
    """The aligned blocks of ``size`` whose every device is in ``free``, in
    ``aligned_blocks`` order: where replicas of ``size`` can go on ``free`` devices."""
    fs = set(free)
    return [b for b in aligned_blocks(device_host, size) if fs.issuperset(b)]


def is_aligned(group: Sequence[int], device_host: Sequence[int], size: int) -> bool:
    """True when ``group`` is exactly one aligned block of ``size`` (any order)."""
    if len(group) != size or not group:
        return False
    if any(not 0 <= d < len(device_host) for d in group):
        return False
    hosts = {device_host[d] for d in group}
    if len(hosts) != 1:
        return False
    slots = host_slots(device_host)
    first = min(slots[d] for d in group)
    host_size = sum(1 for h in device_host if h == next(iter(hosts)))
    return (first % size == 0 and first + size <= host_size
            and sorted(slots[d] for d in group) == list(range(first, first + size)))


def misaligned(groups: Iterable[Sequence[int]], device_host: Sequence[int],
               size: int) -> list[tuple[int, ...]]:
    """The groups of ``groups`` that are not an aligned block of ``size``."""
    return [tuple(g) for g in groups if not is_aligned(g, device_host, size)]


def check_blocks_fit(device_host: Sequence[int], sizes: dict[str, int], where: str) -> None:
    """Raises ConfigError when a replica size exceeds the largest host: under aligned
    blocks such a replica could never be placed. ``sizes`` maps a role's name to its
    replica size; ``where`` names the bindings that set them."""
    largest = max((len(v) for v in host_devices(device_host).values()), default=0)
    for role, size in sizes.items():
        if size > largest:
            raise ConfigError(
                f"PivotPlanner.aligned_blocks: a {role} replica needs {size} devices but the "
                f"largest host has {largest} ({where}); a replica must fit one host's aligned "
                f"block, so lower the replica size (TP x EP) or turn the option off")
