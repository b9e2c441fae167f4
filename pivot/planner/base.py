"""The planner interface every shift strategy implements, and the training shift up
that all of them share (training shifts as a whole, sec. 5.2)."""

from __future__ import annotations

import abc

from pivot.config.validation import check_bool
from pivot.errors import StateError
from pivot.planner.blocks import free_blocks
from pivot.planner.shift_pairs import _host_groups, devices_per_host
from pivot.scheduler.throughput import ThroughputModel
from pivot.types import INFERENCE_ROLES, Role, ShiftDown, ShiftPlan, WorkloadSnapshot


class Planner(abc.ABC):
    """Maps a monitor snapshot to a shift plan, or None to keep the allocation (sec. 7).

    Args:
        rollout_model / reward_model: the roles' throughput models (sec. 6.1).
    """

    reads_lengths = True
    """Whether ``_plan`` reads the snapshot's per-sequence lengths (``ReplicaView.running``'s
    values). A planner that reads only counts, totals and devices sets it False; a driver
    may then hand it views whose totals are true but whose per-sequence lengths lag
    (the simulator's tick, ``pivot.sim.engine.SimCluster.sync_all``), and the check
    skips summing them."""

    aligned_blocks = False
    """Whether every inference replica this planner places sits on an aligned block of one
    host (``pivot.planner.blocks``, sec. 5.2): on wherever a replica's TP/EP groups
    are fixed when its engine starts. Every placing planner takes it as a constructor
    argument and hands it to ``Planner.__init__``."""

    places_replicas = True
    """False for a planner that never places an inference replica (the driver's
    provisioning does), so ``aligned_blocks`` means nothing to it."""

    def __init__(self, rollout_model: ThroughputModel, reward_model: ThroughputModel,
                 aligned_blocks: bool = False) -> None:
        check_bool(f"{type(self).__name__}.aligned_blocks", aligned_blocks)
        self.models = {Role.ROLLOUT: rollout_model, Role.REWARD: reward_model}
        self.aligned_blocks = aligned_blocks

    def cut(self, snap: WorkloadSnapshot, devices, size: int) -> list[tuple[int, ...]]:
        """Freed ``devices`` cut into replicas of ``size``: the aligned blocks they hold
        whole under ``aligned_blocks``, else consecutive groups within one host where a
        replica fits one."""
        if self.aligned_blocks:
            return free_blocks(snap.device_host, size, devices)
        return _host_groups(list(devices), snap.device_host, size, devices_per_host(snap))

    def plan(self, snap: WorkloadSnapshot) -> ShiftPlan | None:
        """Validates the snapshot (raising StateError, never repairing), then plans."""
        snap.check(lengths=self.reads_lengths)
        return self._plan(snap)

    @abc.abstractmethod
    def _plan(self, snap: WorkloadSnapshot) -> ShiftPlan | None: ...

    def check_fits(self, devices: int, max_replicas: dict[Role, int], where: str) -> None:
        """Raises ConfigError when the planner's settings cannot fit the cluster the driver
        builds (``devices`` in all, at most ``max_replicas[role]`` replicas per inference
        role; ``where`` names the group binding). Drivers call it before any engine
        starts; the default checks nothing."""

    def training_up(self, snap: WorkloadSnapshot) -> ShiftPlan | None:
        """Training's shift up when its batch is ready: the cheapest donors that free its
        devices (idle devices first, then replicas by penalty per device)."""
        tr = snap.training
        if not tr.batch_ready or tr.devices:
            return None
        pool = len(snap.device_host) - len(snap.lost_devices)
        if tr.devices_needed > pool:
            raise StateError(f"training needs {tr.devices_needed} devices but only {pool} "
                             f"are alive")
        donors: list[tuple[float, ShiftDown]] = [
            (0.0, ShiftDown(None, None, (d,))) for d in sorted(snap.idle_devices)]
        for role in INFERENCE_ROLES:
            load = snap.role_load(role)
            model = self.models[role]
            for r in load.replicas:
                phi = load.tau_shift * model.throughput(r.num_seqs, r.num_tokens)
                donors.append((phi / len(r.devices), ShiftDown(role, r.replica_id, r.devices)))
        donors.sort(key=lambda x: x[0])
        return self._training_plan(snap, [d for _, d in donors])

    def _training_plan(self, snap: WorkloadSnapshot, ordered: list[ShiftDown]) -> ShiftPlan:
        need = snap.training.devices_needed
        chosen, freed, penalty = [], [], 0.0
        for donor in ordered:
            if len(freed) >= need:
                break
            chosen.append(donor)
            freed.extend(donor.devices)
            if donor.replica_id is not None:
                load = snap.role_load(donor.role)
                r = next(x for x in load.replicas if x.replica_id == donor.replica_id)
                penalty += load.tau_shift * self.models[donor.role].throughput(
                    r.num_seqs, r.num_tokens)
        if len(freed) < need:
            raise StateError(f"training needs {need} devices; the donors free {len(freed)}")
        idle = [d for d in chosen if d.role is None]
        rest = [d for d in chosen if d.role is not None]
        down = ((ShiftDown(None, None, tuple(d for x in idle for d in x.devices)),)
                if idle else ()) + tuple(rest)
        return ShiftPlan(Role.TRAINING, down, (tuple(sorted(freed)[:need]),),
                         penalty=penalty, benefit=-penalty,
                         reason=f"training batch ready: {len(rest)} replicas shift down")
