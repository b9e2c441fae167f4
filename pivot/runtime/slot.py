"""The device slot: one long-lived actor per proc that shifts between roles (sec. 5.2).

Choice: one ``SlotActor`` per proc for the whole run, switching role context, instead of
stopping the old role's actor and spawning the new one (0.02-0.04 s here). Stop-and-spawn
would destroy what the actor owns: a vLLM engine (45-80 s to start on this machine, never
restarted on a shift), a training context's offloaded optimizer state in host memory, and
preserved items (process groups, engine definitions) that sec. 5.2 keeps across shifts.
A slot builds every role's context once, at spawn, and then only applies the shift tables.

Endpoints, by what they act on:

- the slot itself (``SlotActor``): shift down and up, ``describe``, ``tensors``, the
  training Write (``write_back``, ``write_part``), recovery (``reset``) and fault
  injection. They unpack, call the pure code of ``pivot.shifting`` and return timings.
- the active role's context, one typed set per role a slot hosts, as torchforge gives
  each role its own actor: ``EngineEndpoints`` (rollout and reward: ``submit``,
  ``abort``, ``collect``, ``poll``, ``first_tokens``, ``refresh``, ``stats``, over the
  context's ``pivot.roles.engine.slot_context.EngineCalls``) and ``TrainerEndpoints``
  (training: ``train_step``, ``reset_optimizer``, ``optimizer_state``,
  ``held_optimizer_tag``, ``set_optimizer_state``, over
  ``pivot.roles.trainer_context.TrainerCalls``). Each refuses a slot whose active role is
  not its own. The controller reaches them through ``MeshController.engine`` and
  ``MeshController.trainer``.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch
from monarch.actor import Actor, endpoint

from pivot.errors import PivotError, StateError
from pivot.roles.engine.requests import GenRequest, SeqResult
from pivot.roles.engine.slot_context import EngineCalls
from pivot.rl.batch import TrainBatch
from pivot.roles.trainer_context import TrainerCalls
from pivot.shifting.contexts import RoleContext, apply_steps
from pivot.shifting.params import ParameterSource
from pivot.shifting.role_shift import shift_down_steps, shift_up_steps
from pivot.types import INFERENCE_ROLES, Role

log = logging.getLogger(__name__)
C = TypeVar("C")


class InjectedFault(PivotError):
    """A failure ``SlotActor.inject_fault`` asked for."""


class _ActiveRole:
    """What the role endpoint sets read of the slot: its contexts and the active role."""

    device: int
    contexts: dict[Role, RoleContext]
    active: Role | None
    replica_id: str | None

    def _active_context(self, call: str, roles: tuple[Role, ...], calls: type[C],
                        what: str) -> C:
        """The active context for ``call``, a call of ``roles``' contexts (``calls``, a
        runtime-checkable Protocol); refused if no role is active, another role is, or
        the context lacks the calls."""
        names = " or ".join(r.value for r in roles)
        if self.active is None:
            raise StateError(f"slot {self.device}: {call}: no active role; shift up to "
                             f"{names} first")
        if self.active not in roles:
            raise StateError(f"slot {self.device}: {call} ({what} endpoint) is for a {names} "
                             f"replica; the slot holds {self.active.value} replica "
                             f"{self.replica_id}")
        ctx = self.contexts[self.active]
        if not isinstance(ctx, calls):
            raise StateError(f"slot {self.device}: {call}: the {self.active.value} context "
                             f"({type(ctx).__name__}) lacks the {calls.__name__} calls")
        return ctx


class EngineEndpoints(_ActiveRole):
    """The rollout and reward roles' endpoints: the calls the shift-aware scheduler's
    actions make on a replica (sec. 6.2: dispatch, abort with the produced tokens kept,
    collect) and the policy refresh after a training Write (sec. 5.1). Each goes to the
    active context's ``EngineCalls`` (``pivot.roles.engine.slot_context``); a slot holding
    training or nothing refuses them. ``MeshController.engine`` starts them."""

    def _engine(self, call: str) -> EngineCalls:
        return self._active_context(call, INFERENCE_ROLES, EngineCalls, "engine")

    @endpoint
    def submit(self, reqs: list[GenRequest]) -> list[str | None]:
        """Starts ``reqs`` on the active engine (a request with generated tokens resumes
        after a re-prefill); per request None, or why the engine refused it."""
        return self._engine("submit").submit(reqs)

    @endpoint
    def abort(self, seq_ids: list[int]) -> dict[int, SeqResult]:
        """Stops ``seq_ids``; each one's tokens so far (``finish_reason`` "abort"), or its
        final result if it had finished."""
        return self._engine("abort").abort(seq_ids)

    @endpoint
    def collect(self) -> dict[int, SeqResult]:
        """The sequences finished since the last ``collect`` or ``poll``."""
        return self._engine("collect").collect()

    @endpoint
    def poll(self) -> tuple[dict[int, SeqResult], dict[int, int]]:
        """``collect`` and the running sequences' current lengths, in one call."""
        return self._engine("poll").poll()

    @endpoint
    def first_tokens(self, seq_ids: list[int], timeout_s: float = 60.0) -> float:
        """Waits until each of ``seq_ids`` has a new token (the re-prefill of resumed
        sequences, table 3); returns the seconds it took."""
        return self._engine("first_tokens").first_tokens(seq_ids, timeout_s)

    @endpoint
    def refresh(self) -> dict[str, float]:
        """Reads the newest version of the role's model from GPS and loads it, without
        restarting the engine (its sequences were aborted first); phase -> seconds."""
        return self._engine("refresh").refresh()

    @endpoint
    def stats(self) -> dict[str, Any]:
        """The active engine's counters (running sequences, tokens, mean step seconds)."""
        return self._engine("stats").stats()


class TrainerEndpoints(_ActiveRole):
    """The training role's endpoints: the GRPO step and the AdamW state the driver keeps
    across moves of training (sec. 5.2: optimizer state is offloadable context; after a
    resharding the driver sends it back). Each goes to the active context's
    ``TrainerCalls`` (``pivot.roles.trainer_context``) and is made on every slot of the
    training replica at once; a slot holding rollout, reward or nothing refuses them.
    ``MeshController.trainer`` starts them."""

    def _trainer(self, call: str) -> TrainerCalls:
        return self._active_context(call, (Role.TRAINING,), TrainerCalls, "trainer")

    @endpoint
    def train_step(self, batch: TrainBatch, version: int | None = None) -> dict[str, float]:
        """One GRPO update on ``batch`` (each rank trains on its rows) at policy version
        ``version``; its metrics. Collective across the replica's slots."""
        return self._trainer("train_step").train_step(batch, version)

    @endpoint
    def reset_optimizer(self, tag: tuple | None = None) -> None:
        """Fresh AdamW state (a new run on a reused slot), standing for ``tag``."""
        self._trainer("reset_optimizer").reset_optimizer(tag)

    @endpoint
    def optimizer_state(self) -> dict:
        """The full AdamW state on rank 0, {} on the others. Collective."""
        return self._trainer("optimizer_state").optimizer_state()

    @endpoint
    def held_optimizer_tag(self) -> tuple | None:
        """(run, version) of the AdamW state this rank holds; None: none that is valid."""
        return self._trainer("held_optimizer_tag").held_optimizer_tag()

    @endpoint
    def set_optimizer_state(self, state: dict, tag: tuple | None = None) -> None:
        """Restores ``state`` (``optimizer_state``'s, from any slots) before the next
        step, standing for ``tag``; each rank keeps its shard."""
        self._trainer("set_optimizer_state").set_optimizer_state(state, tag)


class SlotActor(EngineEndpoints, TrainerEndpoints, Actor):
    """Holds the role contexts of one device; its role endpoints are ``EngineEndpoints``
    and ``TrainerEndpoints``.

    Args:
        device: the device id this proc stands for.
        host: its host index.
        source: where shift ups Read parameters (GPS, or a stand-in).
        factories: one context factory per role this slot may take (picklable).
        torch_threads: intra-op threads of this proc (None: torch's default). One proc per
            device on a shared 2-core host: with 2 threads under load, copying 7 MB took
            75 ms instead of 3.5 ms with 1 (benchmarks/shift.py notes).
        env: environment of this proc set before any context is built
            (``Backend.slot_env``: on ``cuda`` the one GPU this slot is).
    """

    def __init__(self, device: int, host: int, source: ParameterSource,
                 factories: Mapping[Role, Callable[[], RoleContext]],
                 torch_threads: int | None = 1, env: Mapping[str, str] | None = None):
        if torch_threads is not None:
            torch.set_num_threads(torch_threads)
        self.env = dict(env or {})
        os.environ.update(self.env)
        os.environ["PIVOT_SLOT_DEVICE"] = str(device)  # context factories may read it
        self.device, self.host, self.source = device, host, source
        self.factories = {Role.parse(r): f for r, f in factories.items()}
        self._build()

    def _build(self) -> None:
        t = time.perf_counter()
        self.contexts: dict[Role, RoleContext] = {r: f() for r, f in self.factories.items()}
        self.build_s = time.perf_counter() - t
        self.active: Role | None = None
        self.replica_id: str | None = None
        self.failed_shift: dict[str, Any] | None = None
        """The last shift up's failure and whether it was rolled back (``_roll_back``)."""
        self._fault: tuple[Role | None, int] | None = None   # (role, shift ups to skip)

    @endpoint
    def reset(self) -> float:
        """Recovery, not a shift: rebuilds every context from its factory (offloaded state
        is dropped; an engine would restart). Returns the seconds it took."""
        log.warning("slot %d: reset (was holding %s)", self.device, self._holding())
        self._build()
        return self.build_s

    @endpoint
    def shift_down(self, role: Role, replica_id: str) -> dict[str, float]:
        """Shift-down actions of ``role`` (must be the active one); phase -> seconds."""
        if self.active is not role or self.replica_id != replica_id:
            raise StateError(f"slot {self.device}: asked to shift {role.value} replica "
                             f"{replica_id} down, but it holds {self._holding()}")
        phases = apply_steps(self.contexts[role], shift_down_steps(role), self._no_read)
        self.active, self.replica_id = None, None
        return phases

    @endpoint
    def shift_up(self, role: Role, replica_id: str, layout: Any = None,
                 devices: tuple[int, ...] | None = None,
                 group: Any = None) -> tuple[dict[str, float], int]:
        """Shift-up actions of ``role``: GPS Read, reload, reallocate.

        Args:
            layout: the replica's layout P (None: a full copy on this device).
            devices: the replica's devices G, rank order of ``layout``, this one among
                them; the Read returns this device's shard only (sec. 5.1).
            group: the training replica's process group to join first
                (``pivot.roles.titan.group.GroupSpec``; every slot of it is shifted up at
                the same time), for a context with ``join``.
        Returns:
            (phase -> seconds, the context's KV capacity in tokens; 0 for training).
        """
        if self.active is not None:
            raise StateError(f"slot {self.device}: asked to shift up to {role.value} replica "
                             f"{replica_id}, but it holds {self._holding()}; shift down first")
        ctx = self._context(role)

        if layout is None and hasattr(ctx, "read_parameters"):
            read = ctx.read_parameters   # its own full copy (a TP replica: one version)
        elif getattr(ctx, "is_follower", False):
            def read():   # a follower rank Reads in rank 0's mirrored load
                return {}
        elif layout is None:
            def read():
                return self.source.read(ctx.model, (self.device,), None)[self.device]
        else:
            members = tuple(devices) if devices is not None else (self.device,)
            if self.device not in members:
                raise StateError(f"slot {self.device}: shift up to {role.value} replica "
                                 f"{replica_id} on devices {list(members)}, which lack it")

            def read():
                return self.source.read(ctx.model, members, layout,
                                        only=(self.device,))[self.device]

        read = self._faulty(read, role, replica_id)
        try:
            joined = ctx.join(group) if group is not None and hasattr(ctx, "join") else {}
            phases = {**joined, **apply_steps(ctx, shift_up_steps(role), read)}
        except BaseException as e:
            self.failed_shift = self._roll_back(role, replica_id, ctx, e)
            raise
        self.failed_shift = None
        self.active, self.replica_id = role, replica_id
        return phases, int(ctx.describe().get("kv_capacity", 0))

    def _roll_back(self, role: Role, replica_id: str, ctx: RoleContext,
                   err: BaseException) -> dict[str, Any]:
        """After a failed shift up, the role's shift-down steps release what the steps
        before the failure set up (each release is idempotent), so the slot holds
        nothing and ``MeshController.restore`` can return it to the idle pool without a
        reset. Training is not rolled back: its rank joined a process group the
        replica's other ranks may still be in; its device waits for ``recover``."""
        clean = False
        if role is not Role.TRAINING:
            try:
                apply_steps(ctx, shift_down_steps(role), self._no_read)
                clean = True
            except Exception:  # noqa: BLE001 - reported: the slot stays lost
                log.exception("slot %d: rolling back the failed shift up of %s", self.device,
                              replica_id)
        log.error("slot %d: shift up of %s replica %s failed (%s: %s); rolled back: %s",
                  self.device, role.value, replica_id, type(err).__name__, err, clean)
        return {"role": role.value, "replica_id": replica_id,
                "error": f"{type(err).__name__}: {err}", "clean": clean}

    @endpoint
    def inject_fault(self, role: Role | None = None, skip: int = 0) -> None:
        """Fault injection (``pivot.reliability``): the GPS Read of this slot's shift up
        to ``role`` (None: any) after the next ``skip`` such shift ups raises
        ``InjectedFault``, as a Read whose version a Write dropped would. One armed fault
        at a time."""
        self._fault = (None if role is None else Role.parse(role), skip)

    @endpoint
    def disarm_fault(self) -> bool:
        """Drops an armed ``inject_fault``; returns whether one was armed."""
        armed, self._fault = self._fault is not None, None
        return armed

    def _faulty(self, read: Callable[[], Any], role: Role, replica_id: str
                ) -> Callable[[], Any]:
        if self._fault is None or self._fault[0] not in (None, role):
            return read
        want, skip = self._fault
        if skip > 0:
            self._fault = (want, skip - 1)
            return read
        self._fault = None

        def fail() -> Any:
            raise InjectedFault(f"slot {self.device}: injected fault in the GPS Read of "
                                f"{role.value} replica {replica_id}")
        return fail

    @endpoint
    def describe(self) -> dict[str, Any]:
        """What the slot holds now: role, replica, pid, and each context's residency."""
        return {"device": self.device, "host": self.host, "pid": os.getpid(),
                "hostname": socket.gethostname(),
                "role": self.active, "replica_id": self.replica_id, "build_s": self.build_s,
                "failed_shift": self.failed_shift,
                "env": {k: os.environ.get(k) for k in self.env},
                "context_ids": {r.value: id(c) for r, c in self.contexts.items()},
                "contexts": {r.value: c.describe() for r, c in self.contexts.items()}}

    @endpoint
    def tensors(self, role: Role, item: str) -> dict[str, torch.Tensor]:
        """Copies of a context's tensors (``weights``, ``optimizer_state``, ``gradients``)."""
        ctx = self._context(role)
        if item == "weights":
            src = ctx.weights or {}
        elif item == "optimizer_state" and hasattr(ctx, "optimizer_tensors"):
            src = ctx.optimizer_tensors()
        elif item == "gradients" and hasattr(ctx, "gradient_tensors"):
            src = ctx.gradient_tensors()
        else:
            raise StateError(f"slot {self.device}: {role.value} context has no tensor item "
                             f"{item!r}; use 'weights' or, for training, 'optimizer_state' "
                             f"or 'gradients'")
        return {k: v.detach().to("cpu", copy=True) for k, v in src.items()}

    @endpoint
    def write_back(self, layout: Any = None) -> float:
        """Writes the active context's weights to the source (training, after a step).

        Called on every slot of a training replica (gathering the weights is collective);
        the ranks whose context returns no weights write nothing (rank 0 writes)."""
        if self.active is None:
            raise StateError(f"slot {self.device}: write_back with no active role")
        ctx = self.contexts[self.active]
        t = time.perf_counter()
        weights = dict(ctx.weights)
        if weights:
            self.source.write(ctx.model, (self.device,), layout, {self.device: weights})
        return time.perf_counter() - t

    @endpoint
    def write_part(self, ticket: Any) -> Any:
        """Stages this rank's part of a training replica's Write (``ticket``: begun by the
        controller, ``GPSParameterSource.begin_write``): its own rows of every tensor, with
        no gather (``FsdpShardLayouts``). Returns the ``WritePart`` for the controller to
        finish the Write with."""
        if self.active is None:
            raise StateError(f"slot {self.device}: write_part with no active role")
        ctx = self.contexts[self.active]
        return self.source.write_part(ticket, {self.device: ctx.weight_chunk()},
                                      only=(self.device,))

    def _context(self, role: Role) -> RoleContext:
        if role not in self.contexts:
            raise StateError(f"slot {self.device}: no context for {role.value}; the slot was "
                             f"built for {[r.value for r in self.contexts]}")
        return self.contexts[role]

    def _holding(self) -> str:
        if self.active is None:
            return "nothing"
        return f"{self.active.value} replica {self.replica_id}"

    @staticmethod
    def _no_read():
        raise StateError("a shift down never Reads parameters")
