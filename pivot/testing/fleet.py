"""In-process stand-ins for the cluster driver's slots (tests only; see ``pivot.testing``):
``FakeEngine`` has a slot engine's calls (``EngineCalls``) and advances its sequences one
token per ``step``; ``FakeCtl`` routes the fleet's slot calls to them over a real
``DeviceMap`` through ``FakeEngineHandle``, the typed surface of the controller's
``EngineHandle``, so the fleet, the schedulers, the executor and the fault handling run
their real code without vLLM or Monarch. A slot can die: its calls raise
``SlotProcessDied`` and supervision reports it at the next ``poll_faults``, as
``MeshController`` does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from pivot.roles.engine.requests import GenRequest, SeqResult
from pivot.runtime.pending import SlotProcessDied
from pivot.shifting.device_map import DeviceMap
from pivot.shifting.role_shift import SlotKind

T = TypeVar("T")


class FakeEngine:
    """One slot's engine (``pivot.roles.engine.slot_context.EngineCalls``): sequences
    advance one token per ``step``."""

    def __init__(self):
        self.live: dict[int, tuple[int, list[int]]] = {}
        self.done: dict[int, SeqResult] = {}

    def submit(self, reqs: list[GenRequest]) -> list[str | None]:
        out: list[str | None] = []
        for r in reqs:
            if r.seq_id in self.live:   # request ids are unique while they run
                out.append(f"sequence {r.seq_id} already runs on this engine")
                continue
            self.live[r.seq_id] = (len(r.prompt), list(r.generated))
            out.append(None)
        return out

    def abort(self, seq_ids: list[int]) -> dict[int, SeqResult]:
        out = {}
        for s in seq_ids:
            p, toks = self.live.pop(s)
            out[s] = SeqResult(s, p, toks, [0.0] * len(toks), "abort")
        return out

    def step(self, token: int = 5):
        for _, toks in self.live.values():
            toks.append(token)

    def finish(self, sid: int, tokens: list[int] | None = None):
        p, toks = self.live.pop(sid)
        toks = toks if tokens is None else tokens
        self.done[sid] = SeqResult(sid, p, toks, [0.0] * len(toks), "length")

    def fail(self, sid: int):
        """As a failed engine step ends a sequence: tokens so far, reason "error"."""
        p, toks = self.live.pop(sid)
        self.done[sid] = SeqResult(sid, p, toks, [0.0] * len(toks), "error", "injected")

    def collect(self) -> dict[int, SeqResult]:
        out, self.done = self.done, {}
        return out

    def poll(self) -> tuple[dict[int, SeqResult], dict[int, int]]:
        return self.collect(), {s: p + len(t) for s, (p, t) in self.live.items()}

    def first_tokens(self, seq_ids: list[int], timeout_s: float = 60.0) -> float:
        """No re-prefill to wait for: a resumed sequence has its tokens at once."""
        return 0.0

    def refresh(self) -> dict[str, float]:
        self.refreshed = getattr(self, "refreshed", 0) + 1
        return {"gps_read_s": 0.0, "load_s": 0.0}

    def stats(self) -> dict[str, Any]:
        return {"running": len(self.live),
                "num_tokens": sum(p + len(t) for p, t in self.live.values()),
                "generated_tokens": sum(len(t) for _, t in self.live.values()),
                "mean_step_s": 0.0}


class Answered(Generic[T]):
    """A started call that has its answer (``Pending``'s ``get`` and ``wait``)."""

    def __init__(self, value: T):
        self.value = value

    def get(self, within: float | None = None) -> T:
        return self.value

    async def wait(self) -> T:
        return self.value


class FakeEngineHandle:
    """``MeshController.engine``'s ``EngineHandle`` over a ``FakeCtl`` slot: each call
    runs at once on the slot's ``FakeEngine`` (``FakeCtl.start``) and returns it
    answered."""

    def __init__(self, ctl: FakeCtl, device: int):
        self.ctl, self.device = ctl, device

    def submit(self, reqs: list[GenRequest]) -> Answered[list[str | None]]:
        return self.ctl.start(self.device, "submit", lambda e: e.submit(reqs))

    def abort(self, seq_ids: list[int]) -> Answered[dict[int, SeqResult]]:
        return self.ctl.start(self.device, "abort", lambda e: e.abort(seq_ids))

    def collect(self) -> Answered[dict[int, SeqResult]]:
        return self.ctl.start(self.device, "collect", lambda e: e.collect())

    def poll(self) -> Answered[tuple[dict[int, SeqResult], dict[int, int]]]:
        return self.ctl.start(self.device, "poll", lambda e: e.poll())

    def first_tokens(self, seq_ids: list[int], timeout_s: float = 60.0) -> Answered[float]:
        return self.ctl.start(self.device, "first_tokens",
                              lambda e: e.first_tokens(seq_ids, timeout_s))

    def refresh(self) -> Answered[dict[str, float]]:
        return self.ctl.start(self.device, "refresh", lambda e: e.refresh())

    def stats(self) -> Answered[dict[str, Any]]:
        return self.ctl.start(self.device, "stats", lambda e: e.stats())


class FakeCtl:
    """The mesh controller's calls the fleet and the checker make."""

    def __init__(self, devices: int = 4):
        self.device_map = DeviceMap((0,) * devices)
        self.engines = [FakeEngine() for _ in range(devices)]
        self.slot_override: dict[int, tuple] = {}
        self.dead: set[int] = set()
        self.reported: list[int] = []
        self.die_on: dict[int, str] = {}
        self.killed: list[int] = []

    def engine(self, device: int) -> FakeEngineHandle:
        """``MeshController.engine``: the engine calls of the slot ``device``."""
        return FakeEngineHandle(self, device)

    def start(self, device: int, name: str, call: Callable[[FakeEngine], T]) -> Answered[T]:
        """Runs the engine call ``name`` (``call`` of the slot's engine) now and returns it
        answered; a dead slot's call raises ``SlotProcessDied`` (and so does the call
        ``die`` armed: the slot dies as it is made)."""
        if self.die_on.get(device) == name:
            del self.die_on[device]
            self._die(device)
        if device in self.dead:
            raise SlotProcessDied(f"slot {device} died (FakeCtl.die)")
        return Answered(call(self.engines[device]))

    def describe_all(self):
        out = []
        for d, st in enumerate(self.device_map.states):
            role, rid = (st.role, st.replica_id) if st.kind is SlotKind.ACTIVE else (None, None)
            role, rid = self.slot_override.get(d, (role, rid))
            out.append({"role": role, "replica_id": rid})
        return out

    # ---- supervision (``MeshController``'s fault calls) --------------------------
    def die(self, device: int, when: str | None = None) -> None:
        """The slot's process dies now, or at its next engine call ``when`` (a
        ``FakeEngineHandle`` method's name)."""
        if when is None:
            self._die(device)
        else:
            self.die_on[device] = when

    def can_kill(self, devices) -> bool:
        return True

    def kill(self, devices) -> None:
        """``MeshController.kill``: the slots die at the controller's hand, taken as
        reported (LOST now; no report follows)."""
        self.killed += list(devices)
        for d in devices:
            self.dead.add(d)
            self.engines[d] = FakeEngine()   # what the process held is gone with it
            self.device_map.mark_lost((d,), "killed (FakeCtl.kill)")

    def _die(self, device: int) -> None:
        self.dead.add(device)
        self.engines[device] = FakeEngine()
        self.reported.append(device)

    @property
    def faults_reported(self) -> bool:
        return bool(self.reported)

    def poll_faults(self) -> tuple[int, ...]:
        hit, self.reported = tuple(self.reported), []
        for d in hit:
            self.device_map.mark_lost((d,), "process died (FakeCtl.die)")
        return hit

    def replace(self, devices) -> None:
        for d in devices:
            self.dead.discard(d)
            self.engines[d] = FakeEngine()
