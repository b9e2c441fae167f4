"""Steps 1 and 2 of the planner (sec. 7.1): the shift-up role and its shift pairs.

A shift pair is an exclusive set of donors (idle devices, idle training, or replicas of
the opposite inference role) that frees exactly the devices of ``r`` shift-up replicas,
with the penalty phi = sum(tau_shift * T_i) over its donor replicas (app. D.1). Replicas
of the two roles may differ in size: with donors of d devices and shift-up replicas of u,
a pair takes lcm(d, u) / d donors on one host and yields lcm(d, u) / u replicas.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from pivot.planner.blocks import aligned_blocks
from pivot.scheduler.throughput import ThroughputModel
from pivot.types import Role, RoleLoad, ShiftDown, WorkloadSnapshot

INFINITE = float("inf")


@dataclass(frozen=True, slots=True)
class ShiftPair:
    """Donors that shift down together and the device groups of the replicas they free."""

    down: tuple[ShiftDown, ...]
    up_devices: tuple[tuple[int, ...], ...]
    penalty: float

    @property
    def r(self) -> int:
        return len(self.up_devices)


def role_throughput(load: RoleLoad, model: ThroughputModel) -> float:
    """T_Role: the modeled throughput summed over the role's replicas."""
    return sum(model.throughput(r.num_seqs, r.num_tokens) for r in load.replicas)


def generation_latency(load: RoleLoad, model: ThroughputModel) -> float:
    """tau_Role = N_Role / T_Role (sec. 7.1); infinite when work waits on no throughput."""
    n = load.num_seqs
    if n == 0:
        return 0.0
    t = role_throughput(load, model)
    return n / t if t > 0 else INFINITE


def choose_shift_up_role(snap: WorkloadSnapshot, models: dict[Role, ThroughputModel]) -> Role:
    """Step 1: training if its next batch is ready (and it holds no devices), else the
    inference role with the larger generation latency tau (ties go to the one with more
    sequences, then to rollout)."""
    if snap.training.batch_ready and not snap.training.devices:
        return Role.TRAINING
    tau_ro = generation_latency(snap.rollout, models[Role.ROLLOUT])
    tau_rm = generation_latency(snap.reward, models[Role.REWARD])
    if tau_rm > tau_ro or (tau_rm == tau_ro and snap.reward.num_seqs > snap.rollout.num_seqs):
        return Role.REWARD
    return Role.ROLLOUT


def _host_groups(devices: list[int], hosts: tuple[int, ...], size: int,
                 per_host: int) -> list[tuple[int, ...]]:
    """Cuts devices into groups of ``size``, each within one host when it fits one."""
    if size > per_host:
        devs = sorted(devices)
        return [tuple(devs[i:i + size]) for i in range(0, len(devs) - size + 1, size)]
    by_host: dict[int, list[int]] = defaultdict(list)
    for d in sorted(devices):
        by_host[hosts[d]].append(d)
    groups = []
    for h in sorted(by_host):
        devs = by_host[h]
        groups += [tuple(devs[i:i + size]) for i in range(0, len(devs) - size + 1, size)]
    return groups


def devices_per_host(snap: WorkloadSnapshot) -> int:
    counts: dict[int, int] = defaultdict(int)
    for h in snap.device_host:
        counts[h] += 1
    return max(counts.values()) if counts else 0


def prepare_shift_pairs(snap: WorkloadSnapshot, up: Role,
                        models: dict[Role, ThroughputModel]) -> list[ShiftPair]:
    """Step 2 for an inference shift-up role: all disjoint shift pairs, sorted by phi."""
    up_load = snap.role_load(up)
    u = up_load.replica_devices
    hosts = snap.device_host
    per_host = devices_per_host(snap)
    pairs: list[ShiftPair] = []

    # Idle devices (after a training shift down, or left over): free, phi = 0.
    for g in _host_groups(list(snap.idle_devices), hosts, u, per_host):
        pairs.append(ShiftPair((ShiftDown(None, None, g),), (g,), 0.0))

    # Training that finished its step and waits: donates everything, phi = 0.
    tr = snap.training
    if tr.devices and not tr.busy and not tr.batch_ready:
        groups = _host_groups(list(tr.devices), hosts, u, per_host)
        if groups:
            pairs.append(ShiftPair((ShiftDown(Role.TRAINING, None, tr.devices),),
                                   tuple(groups), 0.0))

    # Replicas of the opposite inference role.
    other = Role.REWARD if up is Role.ROLLOUT else Role.ROLLOUT
    down_load = snap.role_load(other)
    d = down_load.replica_devices
    m = math.lcm(d, u) // d
    model = models[other]
    key = (lambda r: hosts[r.devices[0]]) if max(d, u) <= per_host else (lambda r: 0)
    by_host: dict[int, list] = defaultdict(list)
    for r in down_load.replicas:
        by_host[key(r)].append(r)
    for h in sorted(by_host):
        reps = sorted(by_host[h], key=lambda r: (model.throughput(r.num_seqs, r.num_tokens),
                                                 r.replica_id))
        for i in range(0, len(reps) - m + 1, m):
            chunk = reps[i:i + m]
            freed = sorted(dv for r in chunk for dv in r.devices)
            groups = [tuple(freed[j:j + u]) for j in range(0, len(freed), u)]
            phi = sum(down_load.tau_shift * model.throughput(r.num_seqs, r.num_tokens)
                      for r in chunk)
            pairs.append(ShiftPair(tuple(ShiftDown(other, r.replica_id, r.devices)
                                         for r in chunk), tuple(groups), phi))
    pairs.sort(key=lambda p: p.penalty)  # stable: idle, training, then replicas by host
    return pairs


def prepare_aligned_shift_pairs(snap: WorkloadSnapshot, up: Role,
                                models: dict[Role, ThroughputModel]) -> list[ShiftPair]:
    """Step 2 under aligned blocks (sec. 5.2, ``pivot.planner.blocks``): the new
    replicas of ``up`` (``u`` devices each) go on aligned blocks of ``u`` only.

    A block can be freed when each of its devices is idle, held by a replica of the other
    inference role, or held by training that waits (not busy, batch not ready); a block
    with a lost device, a device of ``up`` or of training that may not shift is never
    used. Blocks that share a donor (a replica or training) must shift together, so a pair
    is a connected set of freeable blocks: its donors are every replica and training that
    hold a device in them (whole, as they shift whole; their devices outside the blocks
    go idle), plus the idle devices in the blocks; phi is the donor replicas' sum, as in
    ``prepare_shift_pairs``. Smaller replicas that free a non-aligned set therefore feed
    no larger replica. Sorted by phi; among equal phi, idle-only pairs first, then
    training's, then by host, throughput and replica id (with blocks of one device this
    is ``prepare_shift_pairs``'s order and its pairs)."""
    u = snap.role_load(up).replica_devices
    other = Role.REWARD if up is Role.ROLLOUT else Role.ROLLOUT
    down_load = snap.role_load(other)
    model = models[other]
    tr = snap.training
    train_gives = bool(tr.devices) and not tr.busy and not tr.batch_ready
    owner: dict[int, object] = {d: None for d in snap.idle_devices}   # None: idle
    replica_of = {}
    for r in down_load.replicas:
        replica_of[r.replica_id] = r
        owner.update({d: r.replica_id for d in r.devices})
    if train_gives:
        owner.update({d: Role.TRAINING for d in tr.devices})

    blocks = [b for b in aligned_blocks(snap.device_host, u) if all(d in owner for d in b)]
    # union-find over blocks: two blocks join when a donor holds devices in both
    parent = list(range(len(blocks)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i
    first_block: dict[object, int] = {}
    for i, b in enumerate(blocks):
        for d in b:
            o = owner[d]
            if o is None:
                continue
            j = first_block.setdefault(o, i)
            parent[find(i)] = find(j)
    comps: dict[int, list[int]] = defaultdict(list)
    for i in range(len(blocks)):
        comps[find(i)].append(i)

    tput = {rid: model.throughput(r.num_seqs, r.num_tokens) for rid, r in replica_of.items()}
    keyed = []
    for members in comps.values():
        groups = tuple(blocks[i] for i in members)
        devs = [d for g in groups for d in g]
        idle = tuple(sorted(d for d in devs if owner[d] is None))
        donors = list(dict.fromkeys(owner[d] for d in devs if owner[d] is not None))
        rids = sorted((o for o in donors if o is not Role.TRAINING),
                      key=lambda rid: (tput[rid], rid))
        down = ((ShiftDown(None, None, idle),) if idle else ()) + (
            (ShiftDown(Role.TRAINING, None, tr.devices),) if Role.TRAINING in donors
            else ()) + tuple(ShiftDown(other, rid, replica_of[rid].devices) for rid in rids)
        phi = sum(down_load.tau_shift * tput[rid] for rid in rids)
        kind = 0 if not donors else 1 if Role.TRAINING in donors else 2
        order = (kind, snap.device_host[groups[0][0]], sum(tput[r] for r in rids),
                 rids[0] if rids else "", members[0])
        keyed.append((order, ShiftPair(down, groups, phi)))
    keyed.sort(key=lambda x: x[0])
    pairs = [p for _, p in keyed]
    pairs.sort(key=lambda p: p.penalty)
    return pairs
