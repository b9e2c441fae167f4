"""In-process stand-ins for the cluster driver's slots (tests only; see ``pivot.testing``):
``FakeEngine`` advances its sequences one token per ``step`` and ``FakeCtl`` routes the
fleet's slot calls to them over a real ``DeviceMap``, so the fleet, the schedulers, the
executor and the fault handling run their real code without vLLM or Monarch. A slot can
die: its calls raise ``SlotProcessDied`` and supervision reports it at the next
``poll_faults``, as ``MeshController`` does."""

from __future__ import annotations

from types import SimpleNamespace

from pivot.roles.engine.requests import SeqResult
from pivot.runtime.pending import SlotProcessDied
from pivot.shifting.device_map import DeviceMap
from pivot.shifting.role_shift import SlotKind


class FakeEngine:
    """One slot's engine: sequences advance one token per ``step``."""

    def __init__(self):
        self.live: dict[int, tuple[int, list[int]]] = {}
        self.done: dict[int, SeqResult] = {}

    def submit(self, reqs):
        out: list[str | None] = []
        for r in reqs:
            if r.seq_id in self.live:   # request ids are unique while they run
                out.append(f"sequence {r.seq_id} already runs on this engine")
                continue
            self.live[r.seq_id] = (len(r.prompt), list(r.generated))
            out.append(None)
        return out

    def abort(self, seq_ids):
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

    def poll(self):
        out, self.done = self.done, {}
        return out, {s: p + len(t) for s, (p, t) in self.live.items()}

    def refresh(self):
        self.refreshed = getattr(self, "refreshed", 0) + 1


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

    def invoke(self, device, method, **kwargs):
        if self.die_on.get(device) == method:
            del self.die_on[device]
            self._die(device)
        if device in self.dead:
            raise SlotProcessDied(f"slot {device} died (FakeCtl.die)")
        return getattr(self.engines[device], method)(**kwargs)

    def invoke_start(self, device, method, **kwargs):
        out = self.invoke(device, method, **kwargs)
        return SimpleNamespace(get=lambda: out)

    def describe_all(self):
        out = []
        for d, st in enumerate(self.device_map.states):
            role, rid = (st.role, st.replica_id) if st.kind is SlotKind.ACTIVE else (None, None)
            role, rid = self.slot_override.get(d, (role, rid))
            out.append({"role": role, "replica_id": rid})
        return out

    # ---- supervision (``MeshController``'s fault calls) --------------------------
    def die(self, device: int, when: str | None = None) -> None:
        """The slot's process dies now, or at its next call of method ``when``."""
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
