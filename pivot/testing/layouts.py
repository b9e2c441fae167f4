"""Random device layouts for planner tests (tests only; see ``pivot.testing``): hosts of
several sizes, rollout and reward replicas of several devices each, placed on aligned
blocks, on contiguous runs that may cross a host, or on scattered devices, and training
holding, waiting for or running on devices. Aligned blocks (sec. 5.2): the
planner's aligned-block option is checked on these, and so is its unchanged default.

Built from one ``random.Random`` so hypothesis (``st.randoms``) and fixed seeds share it.
"""

from __future__ import annotations

import random

from pivot.testing.planner import fill
from pivot.types import ReplicaView, Role, RoleLoad, TrainingLoad, WorkloadSnapshot

SIZES = (1, 2, 3, 4, 8)
"""Replica sizes drawn (those up to the host size): TP x EP of table 1's models, and 3,
which does not divide a host of 8."""


def _device_host(rng: random.Random, per_host: int, hosts: int) -> tuple[int, ...]:
    """Device d on host d // per_host, or (one layout in five) hosts interleaved."""
    n = per_host * hosts
    if rng.random() < 0.2 and hosts > 1:
        return tuple(d % hosts for d in range(n))
    return tuple(d // per_host for d in range(n))


def _place(rng: random.Random, free: list[int], device_host: tuple[int, ...], size: int,
           style: str) -> tuple[int, ...] | None:
    """Devices for one replica of ``size`` taken from ``free`` (None when none fit)."""
    if len(free) < size:
        return None
    if style == "scattered":
        return tuple(sorted(rng.sample(free, size)))
    if style == "run":  # consecutive free ids from a random start; may cross a host
        fs = sorted(free)
        starts = [i for i in range(len(fs) - size + 1) if fs[i + size - 1] - fs[i] == size - 1]
        if not starts:
            return None
        i = rng.choice(starts)
        return tuple(fs[i:i + size])
    # aligned: a whole block [j*size, (j+1)*size) of one host's devices, all free
    by_host: dict[int, list[int]] = {}
    for d in range(len(device_host)):
        by_host.setdefault(device_host[d], []).append(d)
    fset = set(free)
    blocks = [tuple(devs[j * size:(j + 1) * size])
              for devs in by_host.values() for j in range(len(devs) // size)
              if all(x in fset for x in devs[j * size:(j + 1) * size])]
    return rng.choice(blocks) if blocks else None


def random_snapshot(rng: random.Random,
                    sizes: tuple[int, int] | None = None) -> WorkloadSnapshot:
    """A valid ``WorkloadSnapshot`` on a random layout (see the module docstring);
    ``sizes`` fixes the (rollout, reward) replica sizes instead of drawing them."""
    per_host = rng.choice((2, 4, 6, 8))
    hosts = rng.randint(1, 4)
    device_host = _device_host(rng, per_host, hosts)
    n = len(device_host)
    fits = [s for s in SIZES if s <= per_host]
    drawn = (rng.choice(fits), rng.choice(fits))
    ro, rm = sizes if sizes is not None else drawn
    size = {Role.ROLLOUT: ro, Role.REWARD: rm}
    style = rng.choice(("aligned", "aligned", "run", "scattered"))
    free = list(range(n))
    rng.shuffle(free)

    need = rng.choice([s for s in (per_host, 2 * per_host, n // 2) if 0 < s <= n])
    training_state = rng.choice(("holds", "holds_busy", "none", "ready"))
    tr_devs: tuple[int, ...] = ()
    if training_state in ("holds", "holds_busy") and need <= n:
        tr_devs = _place(rng, free, device_host, need, "run") or tuple(free[:need])
        free = [d for d in free if d not in tr_devs]

    views: dict[Role, list[ReplicaView]] = {Role.ROLLOUT: [], Role.REWARD: []}
    kv = {Role.ROLLOUT: 40_000, Role.REWARD: 80_000}
    idle_share = rng.choice((0.0, 0.1, 0.3))
    tries = 0
    while free and tries < 4 * n:
        tries += 1
        if rng.random() < idle_share:
            break
        role = rng.choice((Role.ROLLOUT, Role.REWARD))
        devs = _place(rng, free, device_host, size[role], style)
        if devs is None:
            continue
        free = [d for d in free if d not in devs]
        views[role].append(ReplicaView(f"{role.value[:2]}{len(views[role])}", role, devs,
                                       kv[role]))
    sid = 0
    for role, vs in views.items():
        for v in vs:
            for _ in range(rng.randint(0, 6)):
                length = rng.randint(200, 4000)
                if v.num_tokens + length <= v.kv_capacity:
                    sid = fill(v, [length], sid)
    waiting = {r: [(sid + i + 1000 * k, rng.randint(500, 3000))
                   for i in range(rng.choice((0, 0, 5, 40)))]
               for k, r in enumerate((Role.ROLLOUT, Role.REWARD))}
    loads = {r: RoleLoad(r, views[r], waiting[r], size[r], kv[r], n // size[r],
                         tau_shift=rng.choice((0.5, 1.0, 3.0)))
             for r in (Role.ROLLOUT, Role.REWARD)}
    tr = TrainingLoad(need, tr_devs, busy=training_state == "holds_busy",
                      batch_ready=training_state == "ready")
    lost = tuple(sorted(free[:1])) if free and rng.random() < 0.1 else ()
    idle = tuple(sorted(d for d in free if d not in lost))
    snap = WorkloadSnapshot(0.0, loads[Role.ROLLOUT], loads[Role.REWARD], tr, device_host,
                            idle_devices=idle, lost_devices=lost)
    snap.check()
    return snap
