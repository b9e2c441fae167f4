"""The mesh controller: owns the device procs, their slots and the device map (sec. 5, 4).

One controller per run. It allocates the procs (``provision``), spawns one long-lived
``SlotActor`` per device (its own actor mesh, so a slot can be stopped or replaced alone),
and is the ``SlotBackend`` of a ``Shifter``: a shift fans the slot endpoint out over the
replica's devices in parallel and reports, per phase, the slowest device's time.

The active role's calls go through typed handles, one per role a slot hosts:
``engine(device)`` (``EngineHandle``: the rollout or reward engine's ``submit``,
``abort``, ``collect``, ``poll``, ``first_tokens``, ``refresh``, ``stats``) and
``trainer(device)`` (``TrainerHandle``: ``train_step`` and the AdamW state calls). Each
method starts its ``SlotActor`` endpoint (``EngineEndpoints``, ``TrainerEndpoints``) on the
proc holding the device's active role and returns its ``Pending`` at once: calls to
several slots started before any ``get`` run concurrently.

Shifting never restarts a process or an engine; it only changes what the slots hold.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pivot.compat.monarch import install_fault_hook
from pivot.errors import StateError
from pivot.roles.titan.group import GroupStore
from pivot.runtime.pending import Pending, PendingShift, PendingWrite, SlotProcessDied
from pivot.runtime.provision import Allocation, allocate, spawn_on
from pivot.runtime.slot import SlotActor
from pivot.shifting.contexts import RoleContext
from pivot.shifting.device_map import Clock, DeviceMap
from pivot.shifting.params import ParameterSource
from pivot.shifting.role_shift import SlotKind
from pivot.shifting.shifter import ShiftResult, Shifter
from pivot.types import Role

if TYPE_CHECKING:
    from pivot.roles.engine.requests import GenRequest, SeqResult
    from pivot.rl.batch import TrainBatch

log = logging.getLogger(__name__)


class MeshController:
    """Device slots on a Monarch proc mesh, shifted through a ``Shifter``.

    A device's slot is one proc holding every role's context, or, with
    ``proc_per_role``, one proc per role (vLLM keeps its sleep allocator and parallel
    groups once per process, so on GPUs each engine and the trainer get their own).
    Callers see the same device either way: the controller routes a shift to the role's
    proc and a role's call (``engine``, ``trainer``) to the proc holding the active role.

    Args:
        alloc: the procs (``provision.allocate``; ``procs_per_device`` of them per device
            when ``proc_per_role``, one per role in ``factories`` order).
        source: the parameter source every slot Reads from (picklable client).
        factories: role -> context factory, built once in every slot.
        clock: time source of the device map's events.
        torch_threads: intra-op threads per slot proc (None: torch's default).
        call_timeout_s: a slot call that takes longer fails (a dead process never answers).
        layouts: the layout of a replica, by role and devices (e.g.
            ``gps_source.TensorParallelReplicas``: TP = replica size;
            ``gps_source.FsdpShardLayouts``: a training rank Reads its rows), or None for a
            full copy per device; None (the default) gives every replica full copies.
        slot_env: device -> environment of its slot procs (``Backend.slot_env``); None
            sets nothing.
        proc_per_role: one proc per role on each device (``Backend.proc_per_role``).
        replica_sizes: role -> devices of one replica whose engines are fixed to aligned
            blocks (TP > 1, ``GeneratorFactory``): a shift up of that role on any other
            set of devices is refused. Roles not named take any devices.
    """

    def __init__(self, alloc: Allocation, source: ParameterSource,
                 factories: Mapping[Role, Callable[[], RoleContext]],
                 clock: Clock = time.monotonic, torch_threads: int | None = 1,
                 call_timeout_s: float = 120.0,
                 layouts: Callable[[Role, tuple[int, ...]], Any] | None = None,
                 slot_env: Callable[[int], Mapping[str, str]] | None = None,
                 proc_per_role: bool = False,
                 replica_sizes: Mapping[Role, int] | None = None):
        if not factories:
            raise StateError("MeshController: factories is empty; give a context factory "
                             "for each role the slots may take")
        if call_timeout_s <= 0:
            raise StateError(f"MeshController: call_timeout_s must be > 0, got {call_timeout_s}")
        factories = {Role.parse(r): f for r, f in factories.items()}
        self.keys: tuple[Role | None, ...] = tuple(factories) if proc_per_role else (None,)
        """What each proc of a device holds: its role, or None (every role)."""
        if alloc.procs_per_device != len(self.keys):
            raise StateError(f"MeshController: the allocation gives each device "
                             f"{alloc.procs_per_device} procs, the slots need "
                             f"{len(self.keys)} (proc_per_role={proc_per_role}, roles "
                             f"{[r.value for r in factories]}); allocate(..., "
                             f"procs_per_device={len(self.keys)})")
        self.alloc = alloc
        self.timeout = call_timeout_s
        self.layouts = layouts
        self.source = source
        self._factories = factories
        self.replica_sizes = {r: k for r, k in (replica_sizes or {}).items() if k > 1}
        self._threads = torch_threads
        self._slot_env = slot_env
        self.failures: list[str] = []
        self._faults: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self.dead: set[int] = set()
        """Devices with a dead proc (until ``recover``)."""
        self._dead_procs: set[tuple[int, int]] = set()
        self._dead_names: set[str] = set()   # slot meshes supervision reported failed
        install_fault_hook(self._on_fault, weak=True)  # every live controller sees faults
        t = time.perf_counter()
        n = len(alloc.device_host)
        self.procs = [[alloc.proc(d, k) for k in range(len(self.keys))] for d in range(n)]
        self._gen = [[0] * len(self.keys) for _ in range(n)]
        self._prefix = f"c{next(_NEXT_ID)}slot"
        self._active: list[int] = [0] * n  # which proc of a device holds its active role
        self._writing: set[int] = set()     # devices whose training replica is Writing
        self.slots = [[self._spawn(d, k) for k in range(len(self.keys))] for d in range(n)]
        """The slot actors: ``slots[d][k]`` holds ``keys[k]`` on device d."""
        self._where: dict[tuple[int, int], tuple[str, int]] = {}
        """(device, proc) -> (hostname, pid), for ``kill``: taken at spawn, since a proc
        stuck in a collective answers no call."""
        # describe_all waits for every constructor, so spawn time is measured whole
        for d, desc in enumerate(self.describe_all()):
            for k, pid in enumerate(desc["pids"]):
                self._where[(d, k)] = (desc["hostnames"][k], pid)
        self.spawn_s = time.perf_counter() - t
        self.device_map = DeviceMap(alloc.device_host, clock=clock)
        self.shifter = Shifter(self.device_map, self)
        self.training_groups = GroupStore(prefix=f"{self._prefix}train")
        """The store and specs of the training replicas' process groups."""
        log.info("spawned %d slots (%d procs each) in %.2f s", n, len(self.keys),
                 self.spawn_s)

    def _name(self, device: int, k: int) -> str:
        """A slot mesh's name, unique per controller; Monarch reports failures as
        ``<name>-<uid>``."""
        key = self.keys[k]
        g = self._gen[device][k]
        return (f"{self._prefix}{device}{key.value if key is not None else ''}"
                f"{f'r{g}' if g else ''}")

    def reported_dead(self, device: int) -> bool:
        """Whether supervision reported a proc of ``device`` dead (before ``poll_faults``
        took the report)."""
        return any(self._name(device, k) in self._dead_names for k in range(len(self.keys)))

    def _pending(self, device: int, k: int, fut: Any) -> Pending:
        """A started call to proc ``k`` of ``device``: it fails as soon as supervision
        reports that proc dead, not when its timeout runs out."""
        name = self._name(device, k)
        return Pending(fut, self.timeout, lambda: name in self._dead_names,
                       f"slot {device} ({name})")

    def _spawn(self, device: int, k: int):
        env = dict(self._slot_env(device)) if self._slot_env is not None else None
        key = self.keys[k]
        factories = self._factories if key is None else {key: self._factories[key]}
        return spawn_on(self.procs[device][k], self._name(device, k), SlotActor, device,
                        self.alloc.device_host[device], self.source, factories,
                        self._threads, env)

    def actor(self, device: int, role: Role | None = None):
        """The slot actor of ``device`` that holds ``role``'s context (its one actor
        without ``proc_per_role``)."""
        return self.slots[self._check(device)][self._key(device, role)]

    def _key(self, device: int, role: Role | None) -> int:
        if self.keys == (None,):
            return 0
        if role not in self.keys:
            raise StateError(f"slot {device}: no context for "
                             f"{role.value if role else None}; the slot was built for "
                             f"{[r.value for r in self.keys]}")
        return self.keys.index(role)

    def _holder(self, device: int):
        """The actor of ``device`` that holds (or last held) its active role."""
        return self.slots[self._check(device)][self._active[device]]

    @classmethod
    def local(cls, num_devices: int, source: ParameterSource,
              factories: Mapping[Role, Callable[[], RoleContext]], hosts: int = 1,
              proc_per_role: bool = False, **kwargs: Any) -> "MeshController":
        """Allocates the procs of ``num_devices`` devices over ``hosts`` hosts and spawns
        their slots; ``kwargs`` go to the constructor."""
        per_device = len(factories) if proc_per_role else 1
        return cls(allocate(num_devices, hosts, procs_per_device=per_device), source,
                   factories, proc_per_role=proc_per_role, **kwargs)

    # ---- SlotBackend -----------------------------------------------------------------
    def shift_down(self, role: Role, replica_id: str, devices: tuple[int, ...]) -> ShiftResult:
        return self.start_shift_down(role, replica_id, devices).get()

    def shift_up(self, role: Role, replica_id: str, devices: tuple[int, ...]) -> ShiftResult:
        return self.start_shift_up(role, replica_id, devices).get()

    def start_shift_down(self, role: Role, replica_id: str,
                         devices: tuple[int, ...]) -> PendingShift:
        """Starts the shift down on every device of the replica; ``.get()`` waits."""
        self._check_not_writing(f"shift down {role.value} replica {replica_id}", devices)
        calls = [self._pending(d, self._key(d, role),
                               self.actor(d, role).shift_down.call_one(role, replica_id))
                 for d in devices]
        return PendingShift(calls, lambda rs: ShiftResult(_slowest(rs)))

    def _check_not_writing(self, what: str, devices: tuple[int, ...]) -> None:
        busy = sorted(self._writing.intersection(devices))
        if busy:
            raise StateError(f"{what} on devices "
                             f"{list(devices)}: the training replica's GPS Write on {busy} "
                             f"is in flight; shift them after it returns (RLLoop keeps "
                             f"training busy until its weights are published)")

    def start_shift_up(self, role: Role, replica_id: str,
                       devices: tuple[int, ...]) -> PendingShift:
        """Starts the shift up on every device of the replica; ``.get()`` waits."""
        k = self.replica_sizes.get(role)
        if k is not None and (len(devices) != k or devices[0] % k
                              or tuple(devices) != tuple(range(devices[0], devices[0] + k))):
            raise StateError(f"shift up {role.value} replica {replica_id} on devices "
                             f"{list(devices)}: its engines are tensor-parallel blocks of {k} "
                             f"aligned devices, fixed at start; use a block [b*{k}, b*{k}+{k})"
                             f" (the planner's aligned_blocks)")
        self._check_not_writing(f"shift up {role.value} replica {replica_id}", devices)
        layout = self.layouts(role, devices) if self.layouts is not None else None
        for d in devices:
            self._active[d] = self._key(d, role)
        if role is Role.TRAINING:
            # one rank per device, joined in the replica's group (FSDP2, sec. 5.2); with a
            # layout each rank Reads only its rows (FsdpShardLayouts), else a full copy
            spec = self.training_groups.spec(tuple(devices))
            futs = [self.actor(d, role).shift_up.call_one(role, replica_id, layout,
                                                          tuple(devices), spec)
                    for d in devices]
        elif layout is None:  # a full copy per device (every local-driver replica)
            futs = [self.actor(d, role).shift_up.call_one(role, replica_id) for d in devices]
        else:  # each slot Reads its own shard of the replica's layout
            futs = [self.actor(d, role).shift_up.call_one(role, replica_id, layout,
                                                          tuple(devices))
                    for d in devices]

        def done(results: list) -> ShiftResult:
            kv = min(k for _, k in results) if role is not Role.TRAINING else 0
            return ShiftResult(_slowest([p for p, _ in results]), kv)
        return PendingShift([self._pending(d, self._key(d, role), f)
                             for d, f in zip(devices, futs)], done)

    # ---- inspection and role-specific calls ------------------------------------------
    def describe(self, device: int) -> dict[str, Any]:
        """What ``device`` holds (``SlotActor.describe``, its procs' merged): ``pid`` is
        the proc holding the active role (else the first), ``pids`` every proc's."""
        self._check(device)
        calls = [self._pending(device, k, a.describe.call_one())
                 for k, a in enumerate(self.slots[device])]
        return self._merge(device, [c.get() for c in calls])

    def describe_all(self) -> list[dict[str, Any]]:
        """``describe`` of every slot; a slot with a dead proc (until it is replaced)
        answers ``{"device", "dead": True, "role": None, "replica_id": None}``."""
        calls = [[self._pending(d, k, a.describe.call_one()) for k, a in enumerate(s)]
                 for d, s in enumerate(self.slots)]
        out = []
        for d, cs in enumerate(calls):
            try:
                out.append(self._merge(d, [c.get() for c in cs]))
            except SlotProcessDied:
                out.append({"device": d, "dead": True, "role": None, "replica_id": None})
        return out

    def _merge(self, device: int, parts: list[dict[str, Any]]) -> dict[str, Any]:
        held = [p for p in parts if p["role"] is not None]
        out = dict(held[0] if held else parts[self._active[device]])
        out["pids"] = [p["pid"] for p in parts]
        out["hostnames"] = [p["hostname"] for p in parts]
        out["build_s"] = max(p["build_s"] for p in parts)
        for k in ("context_ids", "contexts"):
            out[k] = {r: v for p in parts for r, v in p[k].items()}
        return out

    def tensors(self, device: int, role: Role, item: str):
        k = self._key(device, role)
        actor = self.slots[self._check(device)][k]   # ``actor(device, role)``
        return self._pending(device, k, actor.tensors.call_one(role, item)).get()

    def engine(self, device: int) -> EngineHandle:
        """The engine calls of ``device``'s active rollout or reward replica
        (``SlotActor``'s ``EngineEndpoints``)."""
        return EngineHandle(self, device)

    def trainer(self, device: int) -> TrainerHandle:
        """The trainer calls of ``device``'s rank of the active training replica
        (``SlotActor``'s ``TrainerEndpoints``)."""
        return TrainerHandle(self, device)

    def _start_active(self, device: int, call: Callable[[Any], Any]) -> Pending[Any]:
        """``call(actor)`` started on the proc of ``device`` that holds (or last held) its
        active role; the slot refuses a call of another role."""
        fut = call(self._holder(device))
        return self._pending(device, self._active[device], fut)

    def write_back(self, device: int) -> float:
        return self.write_back_start(device).get()

    def write_back_replica(self, devices: tuple[int, ...]) -> PendingWrite:
        """The training replica's GPS Write of its weights (sec. 5.1), started; ``.get()``
        or ``await .wait()`` for the seconds it took. Under a layout for the replica
        (``FsdpShardLayouts``) every rank stages its own rows into one Write that this
        controller begins and finishes; else rank 0 gathers and Writes full tensors."""
        devices = tuple(devices)
        layout = (self.layouts(Role.TRAINING, devices) if self.layouts is not None
                  else None)
        return PendingWrite(self, devices, layout)

    def write_back_start(self, device: int) -> Pending:
        """Starts the training slot's GPS Write of its weights; ``.get()`` or ``await
        .wait()`` for the seconds it took."""
        return self._pending(device, self._active[device],
                             self._holder(device).write_back.call_one())

    @property
    def faults_reported(self) -> bool:
        """Whether supervision reported failures that ``poll_faults`` has not taken."""
        return bool(self._faults)

    def poll_faults(self) -> tuple[int, ...]:
        """Marks the devices whose slot process died (reported by Monarch's supervision)
        lost; returns them. Call it before taking a snapshot for the planner."""
        with self._lock:
            faults, self._faults = self._faults, []
        hit = []
        for name, msg in faults:
            for d in range(len(self.slots)):
                for k in range(len(self.keys)):
                    if name.split("-")[0] != self._name(d, k) or (d, k) in self._dead_procs:
                        continue   # not this proc, or taken already (``kill``)
                    self._dead_procs.add((d, k))
                    if d not in hit:
                        hit.append(d)
                        self._lose(d, f"process died: {msg[:160]}")
        if hit:
            log.error("slot processes of devices %s died", hit)
            self._release_writes(hit)
        return tuple(hit)

    def _lose(self, device: int, reason: str) -> None:
        """A device with a dead proc: dead until replaced, LOST in the device map."""
        self.dead.add(device)
        self.device_map.mark_lost((device,), reason)

    def can_kill(self, devices: Sequence[int]) -> bool:
        """Whether ``kill`` reaches every live proc of ``devices``: they run on this
        host (a proc of another host would need its host's agent)."""
        here = socket.gethostname()
        return all(self._where[(d, k)][0] == here for d in devices
                   for k in range(len(self.keys)) if (d, k) not in self._dead_procs)

    def kill(self, devices: Sequence[int]) -> None:
        """SIGKILLs every live proc of ``devices`` and takes them as supervision's report
        would (``poll_faults``): dead, LOST, their half-written GPS versions discarded;
        calls to them fail at once. For the surviving ranks of a replica of several
        devices whose other rank died: they may wait in its collective forever, so the
        replica is replaced whole. Supervision's own later report of them is ignored."""
        if not self.can_kill(devices):
            raise StateError(f"kill: slots {list(devices)} have procs on another host")
        for d in devices:
            for k in range(len(self.keys)):
                if (d, k) in self._dead_procs:
                    continue
                try:
                    os.kill(self._where[(d, k)][1], signal.SIGKILL)
                except ProcessLookupError:
                    pass   # it died on its own meanwhile
                with self._lock:
                    self._dead_names.add(self._name(d, k))
                self._dead_procs.add((d, k))
            self._lose(d, "killed: another rank of its replica died")
        log.error("killed the slot processes of devices %s", list(devices))
        self._release_writes(list(devices))

    def _release_writes(self, devices: list[int]) -> None:
        """A dead slot's half-written GPS versions are discarded now, not when their
        lease expires (``GlobalParameterStorage.writer_lost``)."""
        from pivot.runtime.gps_source import writer_id
        gps = getattr(self.source, "gps", None)
        if gps is None or not hasattr(gps, "writer_lost"):
            return
        for d in devices:
            try:
                gps.writer_lost(writer_id(d))
            except Exception as e:  # noqa: BLE001 - the lease still expires on its own
                log.warning("GPS writer_lost(slot%d): %s; its lease will expire", d, e)

    def restore(self, devices: Sequence[int]) -> tuple[int, ...]:
        """Returns to the idle pool, without a reset, the lost devices whose slots are
        alive and hold nothing (``emptied``); returns them."""
        back = self.emptied(devices)
        if back:
            self.device_map.recover(back)
        return back

    def emptied(self, devices: Sequence[int]) -> tuple[int, ...]:
        """The lost devices of ``devices`` whose slots are alive and now hold nothing: a
        failed shift up that its slot rolled back (``SlotActor._roll_back``), and the
        replica's other ranks that did come up, which are shifted down here. A device
        with training state, a dead proc or a roll back that failed is left out (it
        stays lost; ``recover`` resets it). Slot calls only: the caller returns the
        devices to the pool (``restore``, or ``DeviceMap.recover`` on its own thread)."""
        lost = set(self.device_map.devices_in(SlotKind.LOST))
        back = []
        for d in devices:
            if d not in lost or d in self.dead or self.reported_dead(d):
                continue   # a proc of it died: it is replaced, not emptied
            try:
                self._empty(d)
            except Exception as e:  # noqa: BLE001 - it stays lost; say why
                log.warning("slot %d stays lost: %s", d, e)
                continue
            back.append(d)
        return tuple(back)

    def disarm_faults(self) -> int:
        """Drops every live slot's armed ``inject_fault``; returns how many were armed."""
        futs = [a.disarm_fault.call_one() for d, procs in enumerate(self.slots)
                for k, a in enumerate(procs) if (d, k) not in self._dead_procs]
        return sum(f.get(timeout=self.timeout) for f in futs)

    def _empty(self, device: int) -> None:
        """Shifts down what ``device``'s procs still hold after a failed replica shift;
        raises if one holds training or a failure it could not roll back."""
        for a in self.slots[device]:
            p = a.describe.call_one().get(timeout=self.timeout)
            failed, role = p.get("failed_shift"), p["role"]
            if role is Role.TRAINING:
                raise StateError(f"slot {device} holds training state; recover it")
            if failed and not failed["clean"]:
                raise StateError(f"slot {device}: its failed shift up of {failed['role']} "
                                 f"was not rolled back ({failed['error']}); recover it")
            if role is not None:
                a.shift_down.call_one(role, p["replica_id"]).get(timeout=self.timeout)

    def recover(self, devices: tuple[int, ...]) -> float:
        """Returns lost slots to the idle pool: a live slot proc is reset in place, a dead
        one is replaced by a new proc and slot. Returns the slowest recovery's seconds."""
        secs = self.replace(devices)
        self.device_map.recover(devices)
        return secs

    def replace(self, devices: tuple[int, ...]) -> float:
        """``recover``'s slot work without the device map change (the caller makes it on
        its own thread: ``pivot.cluster.faults``). Returns the slowest slot's seconds."""
        lost = set(self.device_map.devices_in(SlotKind.LOST))
        bad = [d for d in devices if d not in lost]
        if bad:
            raise StateError(f"recover: devices {bad} are not lost "
                             f"({[self.device_map.state(d).describe() for d in bad]})")
        secs = 0.0
        self.training_groups.forget()   # a reset slot lost its groups: form new ones
        for d in devices:
            t = time.perf_counter()
            futs = []
            for k in range(len(self.keys)):
                if (d, k) in self._dead_procs:
                    self.procs[d][k] = self.alloc.replacement(d, k)
                    self._gen[d][k] += 1
                    self.slots[d][k] = self._spawn(d, k)
                    futs.append(self.slots[d][k].describe.call_one())
                    self._dead_procs.discard((d, k))
                else:
                    futs.append(self.slots[d][k].reset.call_one())
            for k, f in enumerate(futs):
                desc = f.get(timeout=self.timeout)
                if isinstance(desc, dict) and "pid" in desc:   # a spawned proc's describe
                    self._where[(d, k)] = (desc["hostname"], desc["pid"])
            self.dead.discard(d)
            secs = max(secs, time.perf_counter() - t)
        return secs

    def stop(self) -> None:
        """Stops every live slot mesh and ends a multi-host job (this host's procs stay
        until the client exits: ``ProcMesh.stop`` takes 4-10 s, docs/stack.md)."""
        for d, procs in enumerate(self.slots):
            for k, a in enumerate(procs):
                if (d, k) not in self._dead_procs:
                    a.stop().get(timeout=self.timeout)
        self.alloc.close()

    def _check(self, device: int) -> int:
        if not 0 <= device < len(self.slots):
            raise StateError(f"device {device} is outside the {len(self.slots)} slots")
        if self.device_map.state(device).kind is SlotKind.LOST:
            raise StateError(f"device {device} is lost; recover it before calling its slot")
        return device

    def _on_fault(self, failure) -> None:
        """Monarch's supervision hook (runs on its thread): keeps the client alive (the
        default hook exits it) and queues the failure for ``poll_faults``."""
        msg = str(failure)
        name = getattr(failure, "mesh_name", "")
        log.error("supervision: mesh %r failed: %s", name, msg)
        with self._lock:
            self.failures.append(msg)
            self._faults.append((name, msg))
            self._dead_names.add(name.split("-")[0])


class EngineHandle:
    """Typed calls to the engine of a device's active rollout or reward replica: each
    starts the ``SlotActor`` endpoint of its name (``EngineEndpoints``, over the context's
    ``pivot.roles.engine.slot_context.EngineCalls``) on the proc holding the active role
    and returns its ``Pending`` (``.get()``, or ``await .wait()``). The device is checked
    (not lost) and routed at each call, as the device map changes between them.

    Args:
        ctl: the controller.
        device: the device; a TP replica's calls go to its first device (rank 0).
    """

    def __init__(self, ctl: MeshController, device: int):
        self.ctl, self.device = ctl, device

    def submit(self, reqs: list[GenRequest]) -> Pending[list[str | None]]:
        """Starts ``reqs``; per request None, or why the engine refused it."""
        return self.ctl._start_active(self.device, lambda a: a.submit.call_one(reqs))

    def abort(self, seq_ids: list[int]) -> Pending[dict[int, SeqResult]]:
        """Stops ``seq_ids``; each one's tokens so far, or its final result."""
        return self.ctl._start_active(self.device, lambda a: a.abort.call_one(seq_ids))

    def collect(self) -> Pending[dict[int, SeqResult]]:
        """The sequences finished since the last ``collect`` or ``poll``."""
        return self.ctl._start_active(self.device, lambda a: a.collect.call_one())

    def poll(self) -> Pending[tuple[dict[int, SeqResult], dict[int, int]]]:
        """``collect`` and the running sequences' current lengths."""
        return self.ctl._start_active(self.device, lambda a: a.poll.call_one())

    def first_tokens(self, seq_ids: list[int], timeout_s: float = 60.0) -> Pending[float]:
        """Seconds until each of ``seq_ids`` had a new token (re-prefill)."""
        return self.ctl._start_active(
            self.device, lambda a: a.first_tokens.call_one(seq_ids, timeout_s))

    def refresh(self) -> Pending[dict[str, float]]:
        """The GPS Read and load of the newest model version; phase -> seconds."""
        return self.ctl._start_active(self.device, lambda a: a.refresh.call_one())

    def stats(self) -> Pending[dict[str, Any]]:
        """The engine's counters."""
        return self.ctl._start_active(self.device, lambda a: a.stats.call_one())


class TrainerHandle:
    """Typed calls to one rank (device) of the active training replica: each starts the
    ``SlotActor`` endpoint of its name (``TrainerEndpoints``, over the context's
    ``pivot.roles.trainer_context.TrainerCalls``) on the device's training proc and
    returns its ``Pending``. A replica's ranks are one FSDP2 group: the collective calls
    must be started on every rank before any is waited for
    (``pivot.cluster.control.ClusterTrainer``).

    Args:
        ctl: the controller.
        device: the rank's device.
    """

    def __init__(self, ctl: MeshController, device: int):
        self.ctl, self.device = ctl, device

    def train_step(self, batch: TrainBatch, version: int | None = None
                   ) -> Pending[dict[str, float]]:
        """One GRPO update on ``batch`` at policy version ``version``; its metrics."""
        return self.ctl._start_active(self.device,
                                      lambda a: a.train_step.call_one(batch, version))

    def reset_optimizer(self, tag: tuple | None = None) -> Pending[None]:
        """Fresh AdamW state standing for ``tag`` (run, version)."""
        return self.ctl._start_active(self.device, lambda a: a.reset_optimizer.call_one(tag))

    def optimizer_state(self) -> Pending[dict]:
        """The full AdamW state (rank 0; {} from the others)."""
        return self.ctl._start_active(self.device, lambda a: a.optimizer_state.call_one())

    def held_optimizer_tag(self) -> Pending[tuple | None]:
        """(run, version) of the AdamW state the rank holds."""
        return self.ctl._start_active(self.device,
                                      lambda a: a.held_optimizer_tag.call_one())

    def set_optimizer_state(self, state: dict, tag: tuple | None = None) -> Pending[None]:
        """Restores ``state`` before the next step, standing for ``tag``."""
        return self.ctl._start_active(
            self.device, lambda a: a.set_optimizer_state.call_one(state, tag))


_NEXT_ID = itertools.count()


def _slowest(per_device: list[dict[str, float]]) -> dict[str, float]:
    """Phase -> the slowest device's seconds (devices shift in parallel)."""
    out: dict[str, float] = {}
    for phases in per_device:
        for k, v in phases.items():
            out[k] = max(out.get(k, 0.0), v)
    return out
