"""Core state of the control plane: roles, sequences, replicas, workload snapshots and
shift plans.

These dataclasses are the whole vocabulary shared by the scheduler (sec. 6), the planner
(sec. 7), the monitor and executor, and the two drivers (``sim``, ``cluster``). They import
no engine; a driver translates its engines' state into them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from pivot.errors import StateError


class Role(enum.Enum):
    """The three RL roles that compete for devices (sec. 2.1)."""

    ROLLOUT = "rollout"
    REWARD = "reward"
    TRAINING = "training"

    @classmethod
    def parse(cls, value: "Role | str") -> "Role":
        """Returns the role named by ``value``; raises StateError for an unknown name."""
        if isinstance(value, Role):
            return value
        try:
            return cls(value)
        except ValueError:
            names = ", ".join(r.value for r in cls)
            raise StateError(f"unknown role {value!r}; expected one of: {names}") from None


INFERENCE_ROLES: tuple[Role, Role] = (Role.ROLLOUT, Role.REWARD)
"""Roles that generate tokens and are scheduled at replica granularity (sec. 5.2)."""

POLICY = "policy"
GENRM = "genrm"
MODEL_OF_ROLE = {Role.ROLLOUT: POLICY, Role.REWARD: GENRM, Role.TRAINING: POLICY}
"""The model a role serves: rollout and training hold the policy, reward holds the GenRM."""


@dataclass(slots=True)
class SequenceState:
    """One generation of the policy or the GenRM (footnote 1 of the paper).

    Lengths are the source of truth, so the simulator can track millions of tokens without
    materialising them; real drivers also keep the token ids, which an abort preserves so
    the sequence resumes after a re-prefill (sec. 6.2).

    Attributes:
        seq_id: unique id; the default queue priority is ascending ``seq_id`` (footnote 3).
        model: ``"policy"`` or ``"genrm"``.
        prompt_len: prompt tokens.
        max_new_tokens: the cap on generated tokens (the scheduler never sees true lengths).
        generated_len: tokens generated so far, kept across aborts.
        priority: optional override of the queue key; ``None`` means ``seq_id``.
        replica_id: the replica it runs on, or ``None`` while it waits in the queue.
        prompt_tokens / generated_tokens: token ids, when the driver has them.
        num_aborts: how often it was migrated (re-prefills it paid).
    """

    seq_id: int
    model: str
    prompt_len: int
    max_new_tokens: int
    generated_len: int = 0
    priority: float | None = None
    replica_id: str | None = None
    prompt_tokens: list[int] | None = None
    generated_tokens: list[int] | None = None
    num_aborts: int = 0

    @property
    def length(self) -> int:
        """Tokens in the KV cache once the sequence runs: prompt plus generated so far."""
        return self.prompt_len + self.generated_len

    @property
    def sort_key(self) -> tuple[float, int]:
        return (self.seq_id if self.priority is None else self.priority, self.seq_id)


@dataclass(slots=True)
class ReplicaView:
    """The scheduler's view of one inference replica (sec. 6.1).

    ``running`` maps sequence id to its current length in tokens; ``num_tokens`` is kept
    equal to the sum of those lengths (N_i^Token) and ``len(running)`` is N_i^Seq.
    """

    replica_id: str
    role: Role
    devices: tuple[int, ...]
    kv_capacity: int
    running: dict[int, int] = field(default_factory=dict)
    num_tokens: int = 0

    @property
    def num_seqs(self) -> int:
        return len(self.running)

    @property
    def free_kv(self) -> int:
        return self.kv_capacity - self.num_tokens

    @property
    def kv_usage(self) -> float:
        return self.num_tokens / self.kv_capacity if self.kv_capacity else 0.0

    def copy(self) -> "ReplicaView":
        return ReplicaView(
            self.replica_id, self.role, self.devices, self.kv_capacity,
            dict(self.running), self.num_tokens,
        )

    def check(self, lengths: bool = True) -> None:
        """Raises StateError if the view is inconsistent; nothing is repaired.
        ``lengths`` False: the per-sequence lengths are not summed against
        ``num_tokens`` (a reader that uses only the counts, ``Planner.reads_lengths``)."""
        if self.kv_capacity <= 0:
            raise StateError(f"replica {self.replica_id}: kv_capacity must be > 0, "
                             f"got {self.kv_capacity}")
        if not self.devices:
            raise StateError(f"replica {self.replica_id}: holds no devices")
        total = sum(self.running.values()) if lengths else self.num_tokens
        if total != self.num_tokens:
            raise StateError(f"replica {self.replica_id}: num_tokens={self.num_tokens} but "
                             f"its running sequences hold {total} tokens")
        if self.num_tokens > self.kv_capacity:
            raise StateError(f"replica {self.replica_id}: {self.num_tokens} tokens exceed its "
                             f"KV capacity of {self.kv_capacity}")


@dataclass(slots=True)
class RoleLoad:
    """One inference role's workload as the monitor reports it (sec. 7.1)."""

    role: Role
    replicas: list[ReplicaView]
    waiting: list[tuple[int, int]]
    """(sequence id, length) of the sequences in the role's waiting queue, in priority order."""
    replica_devices: int
    """Devices one replica of this role needs (TP x EP x PP of its model)."""
    kv_capacity: int
    """KV capacity in tokens of a new replica of this role."""
    max_replicas: int
    """I: replicas the role could own if it had every device of the pool."""
    tau_shift: float = 1.0
    """Shift duration in seconds, treated as a constant (sec. 7.1)."""
    kv_reserve: int = 0
    """The role scheduler's dispatch rule: free KV tokens a replica keeps beyond a
    sequence's length to be eligible (``ShiftAwareScheduler.kv_reserve``)."""
    max_seqs: int | None = None
    """The role scheduler's per-replica batch cap (the engine's ``max_num_seqs``); None:
    none."""

    @property
    def num_seqs(self) -> int:
        """N^Seq_Role: running plus waiting sequences (eq. 1)."""
        return sum(r.num_seqs for r in self.replicas) + len(self.waiting)


@dataclass(slots=True)
class TrainingLoad:
    """Training's state: it shifts as a whole (sec. 5.2)."""

    devices_needed: int
    devices: tuple[int, ...] = ()
    """Devices it holds now; empty when shifted down."""
    busy: bool = False
    """True while a training step runs."""
    batch_ready: bool = False
    """True when the next training batch has all its rewards."""
    tau_shift: float = 2.0


@dataclass(slots=True)
class WorkloadSnapshot:
    """Everything the planner sees at one instant: the monitor's output (sec. 7.1).

    Attributes:
        time: the clock (wall or simulated seconds).
        rollout / reward: the inference roles' loads.
        training: training's load.
        device_host: host index of every device in the pool.
        idle_devices: devices that belong to no role (after a training shift down, say).
        lost_devices: devices whose process died; the planner never assigns them.
    """

    time: float
    rollout: RoleLoad
    reward: RoleLoad
    training: TrainingLoad
    device_host: tuple[int, ...]
    idle_devices: tuple[int, ...] = ()
    lost_devices: tuple[int, ...] = ()

    def role_load(self, role: Role) -> RoleLoad:
        if role is Role.ROLLOUT:
            return self.rollout
        if role is Role.REWARD:
            return self.reward
        raise StateError(f"{role} has no replica load; training shifts as a whole")

    def check(self, lengths: bool = True) -> None:
        """Validates the snapshot: every device in at most one place, replicas consistent.

        Sequences are checked for running on two replicas at once by set sizes (C speed,
        the planner checks every tick); only a snapshot that fails it is walked sequence
        by sequence, for the message. ``lengths`` False: a replica's per-sequence lengths
        are not summed against its ``num_tokens`` (``ReplicaView.check``), for a planner
        that reads only counts and totals (``Planner.reads_lengths``)."""
        seen: set[int] = set()
        count = 0
        for load in (self.rollout, self.reward):
            for r in load.replicas:
                seen.update(r.running)
                count += len(r.running)
        self._check(walk_sequences=len(seen) != count, lengths=lengths)

    def _check(self, walk_sequences: bool, lengths: bool = True) -> None:
        owner: dict[int, str] = {}
        n = len(self.device_host)

        def claim(dev: int, who: str) -> None:
            if not 0 <= dev < n:
                raise StateError(f"{who} holds device {dev}, outside the pool of {n} devices")
            if dev in owner:
                raise StateError(f"device {dev} is held by both {owner[dev]} and {who}")
            owner[dev] = who

        seen_seq: dict[int, str] = {}
        for load in (self.rollout, self.reward):
            if load.replica_devices <= 0 or load.kv_capacity <= 0:
                raise StateError(f"{load.role.value}: replica_devices and kv_capacity must "
                                 f"be > 0, got {load.replica_devices} and {load.kv_capacity}")
            if load.tau_shift < 0:
                raise StateError(f"{load.role.value}: tau_shift must be >= 0, "
                                 f"got {load.tau_shift}")
            for r in load.replicas:
                if r.role is not load.role:
                    raise StateError(f"replica {r.replica_id} has role {r.role.value} but is "
                                     f"listed under {load.role.value}")
                r.check(lengths)
                for d in r.devices:
                    claim(d, f"replica {r.replica_id}")
                for s in r.running if walk_sequences else ():
                    if s in seen_seq:
                        raise StateError(f"sequence {s} runs on both {seen_seq[s]} and "
                                         f"{r.replica_id}")
                    seen_seq[s] = r.replica_id
        for d in self.training.devices:
            claim(d, "training")
        for d in self.idle_devices:
            claim(d, "the idle pool")
        for d in self.lost_devices:
            claim(d, "the lost pool")


@dataclass(frozen=True, slots=True)
class ShiftDown:
    """One donor: an inference replica, training as a whole, or idle devices.

    ``replica_id`` is ``None`` for training (``role`` TRAINING) and for the idle pool
    (``role`` None); ``devices`` are the devices it frees.
    """

    role: Role | None
    replica_id: str | None
    devices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ShiftPlan:
    """A candidate or chosen shift plan, the planner's output (sec. 7.1, app. D.1): the
    role that shifts up, the replicas (or training) that shift down to free devices for it,
    and the device groups of the new shift-up replicas. The executor carries it out in the
    order shift down, migrate, shift up (sec. 4, "Workflow").

    Attributes:
        up_role: the role that gains devices.
        down: donors to shift down first, in order.
        up_devices: one device group per new shift-up replica (training: one group with
            all its devices).
        penalty: phi, tokens forgone while donors stall (sec. 7.1).
        gain: G = H * (T_candidate - T_current) (sec. 7.3); 0 for training shifts.
        benefit: B = G - phi.
        t_current / t_candidate: overall throughput of eq. 1 before and after.
        reason: a short human-readable account, for logs and traces.
    """

    up_role: Role
    down: tuple[ShiftDown, ...]
    up_devices: tuple[tuple[int, ...], ...]
    penalty: float = 0.0
    gain: float = 0.0
    benefit: float = 0.0
    t_current: float = 0.0
    t_candidate: float = 0.0
    reason: str = ""
    timings: dict[str, float] = field(default_factory=dict, compare=False)

    @property
    def num_up(self) -> int:
        return len(self.up_devices)

    @property
    def freed_devices(self) -> tuple[int, ...]:
        return tuple(d for s in self.down for d in s.devices)
