"""Generator replicas as Monarch actors of their own (tests and benchmarks only; see
``pivot.testing``).

The product runs each engine inside a device slot: ``pivot.runtime.slot.SlotActor`` holds
the slot's ``pivot.roles.engine.slot_context.SlotGeneratorContext`` (a ``GeneratorContext``) and the
cluster driver reaches it through ``pivot.cluster.fleet.SlotHandle``. The tests of the engine
behind an actor boundary (tests/roles/test_generator_actor.py, a replica's process killed
in tests/reliability/test_replica_kill.py) and ``benchmarks/engine.py`` use a bare
actor per engine instead:

- ``GeneratorActor``: a Monarch actor holding one in-process vLLM engine and its step
  loop (``pivot.roles.engine``). Endpoints unpack, call the loop, and return; all are
  plain ``def`` (Monarch refuses a class mixing ``def`` and ``async def``).
- ``ActorHandle``: the driver-side handle ``GeneratorPort`` applies actions through.
- ``spawn_generators``: one proc mesh per slot (so each replica stops on its own), the
  slot's engine bound to core ``slot % cores``, and a fault hook that keeps the client up.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
from monarch.actor import Actor, endpoint

from pivot.roles.engine.config import EngineConfig
from pivot.roles.engine.loop import StepLoop, shared_loop
from pivot.roles.engine.requests import GenRequest, SeqResult
from pivot.roles.engine.vllm_engine import EngineStats, ReleaseReport
from pivot.types import POLICY

log = logging.getLogger(__name__)


class GeneratorActor(Actor):
    """One generator replica: runs only the sequences it is dispatched.

    Args:
        cfg: the engine configuration (the engine starts in ``setup``).
        model: which model's engine of the proc it is (``shared_loop``'s key).
    """

    def __init__(self, cfg: EngineConfig, model: str = POLICY):
        self.cfg, self.model = cfg, model
        self.loop: StepLoop | None = None

    @endpoint
    def setup(self) -> dict[str, Any]:
        """Starts the engine (or joins the slot's engine); start seconds and KV capacity.
        Raises ConfigError for a missing or malformed model folder."""
        self.loop = shared_loop(self.model, self.cfg)
        e = self.loop.engine
        return {"start_s": e.start_s, "kv_capacity": self.cfg.kv_capacity, "pid": os.getpid()}

    @endpoint
    def submit(self, reqs: list[GenRequest]) -> list[str | None]:
        return self._loop().submit(reqs)

    @endpoint
    def abort(self, seq_ids: list[int]) -> dict[int, SeqResult]:
        return self._loop().abort(seq_ids)

    @endpoint
    def collect(self) -> dict[int, SeqResult]:
        return self._loop().collect()

    @endpoint
    def poll(self) -> tuple[dict[int, SeqResult], dict[int, int]]:
        return self._loop().poll()

    @endpoint
    def first_tokens(self, seq_ids: list[int], timeout_s: float = 60.0) -> float:
        return self._loop().first_tokens(seq_ids, timeout_s)

    @endpoint
    def generate(self, reqs: list[GenRequest], timeout_s: float = 300.0) -> dict[int, SeqResult]:
        """Submits ``reqs`` and waits for them; rejected ones come back with "error"."""
        loop = self._loop()
        errs = loop.submit(reqs)
        out = {r.seq_id: SeqResult(r.seq_id, len(r.prompt), list(r.generated), [], "error", e)
               for r, e in zip(reqs, errs) if e is not None}
        out.update(loop.wait([r.seq_id for r, e in zip(reqs, errs) if e is None], timeout_s))
        return out

    @endpoint
    def load_weights(self, state: dict[str, torch.Tensor]) -> float:
        """Loads a GPS Read (HF name -> tensor) without restarting; also re-allocates a
        released KV cache. Returns seconds."""
        def run(e):
            s = e.load_weights(state)
            e.reallocate_kv()
            return s
        return self._loop().call(run)

    @endpoint
    def release(self) -> ReleaseReport:
        """Shift down: frees KV cache and weights (RSS before/after in the report)."""
        return self._loop().call(lambda e: e.release())

    @endpoint
    def stats(self) -> EngineStats:
        return self._loop().call(lambda e: e.stats())

    def _loop(self) -> StepLoop:
        if self.loop is None:
            from pivot.errors import StateError
            raise StateError("generator: call setup before any other endpoint")
        return self.loop


@dataclass
class ActorHandle:
    """Driver-side handle over one ``GeneratorActor`` mesh (a single actor)."""

    mesh: Any

    def submit(self, reqs):
        return self.mesh.submit.call_one(reqs).get()

    def abort(self, seq_ids):
        return self.mesh.abort.call_one(list(seq_ids)).get()

    def collect(self):
        return self.mesh.collect.call_one().get()

    def poll(self):
        return self.mesh.poll.call_one().get()

    def first_tokens(self, seq_ids, timeout_s: float = 60.0):
        return self.mesh.first_tokens.call_one(list(seq_ids), timeout_s).get()

    def started(self) -> "_StartedActor":
        """The same calls, each returning at once; ``.get()`` on the result waits (the port
        starts one call per replica before it waits for any)."""
        return _StartedActor(self.mesh)


@dataclass
class _StartedActor:
    """``ActorHandle``'s calls, started: each returns the endpoint's future."""

    mesh: Any

    def submit(self, reqs):
        return self.mesh.submit.call_one(reqs)

    def abort(self, seq_ids):
        return self.mesh.abort.call_one(list(seq_ids))

    def collect(self):
        return self.mesh.collect.call_one()

    def poll(self):
        return self.mesh.poll.call_one()

    def first_tokens(self, seq_ids, timeout_s: float = 60.0):
        return self.mesh.first_tokens.call_one(list(seq_ids), timeout_s)


def install_fault_hook(failures: list[str]) -> None:
    """Keeps the client alive when a generator actor fails (Monarch's default hook exits)
    and appends each failure to ``failures``: a listener of the one fault hook
    (``pivot.compat.monarch``), replacing the one an earlier call installed."""
    from pivot.compat.monarch import install_fault_hook as install

    def hook(failure) -> None:
        failures.append(str(failure))
        log.error("generator failure: %s", failure)

    install(hook, key="pivot.testing.generator")


def spawn_generators(num_slots: int, cfg: EngineConfig, *, cores: int | None = None,
                     setup: bool = True) -> tuple[dict[str, Any], list[Any], list[str]]:
    """Spawns one proc and one ``GeneratorActor`` per slot, named ``slot-<i>``.

    Each slot's engine binds its OpenMP threads to core ``i % cores`` (two engines on one
    core halve each other's throughput, docs/stack.md). Returns (replica id -> actor mesh,
    proc meshes, failures seen by the fault hook).
    """
    from monarch.actor import this_host

    failures: list[str] = []
    install_fault_hook(failures)
    cores = cores or os.cpu_count() or 1
    actors, procs = {}, []
    for i in range(num_slots):
        pm = this_host().spawn_procs(per_host={"procs": 1})
        slot_cfg = dataclasses.replace(cfg, cpu_core=i % cores)
        actors[f"slot-{i}"] = pm.spawn(f"generator_{i}", GeneratorActor, slot_cfg)
        procs.append(pm)
    if setup:
        t = time.perf_counter()
        futs = {rid: a.setup.call_one() for rid, a in actors.items()}
        for rid, f in futs.items():
            info = f.get()
            log.info("%s: engine pid %s started in %.1f s", rid, info["pid"], info["start_s"])
        log.info("%d generator slots up in %.1f s", num_slots, time.perf_counter() - t)
    return actors, procs, failures
