"""The generator replica of the rollout and reward roles (sec. 5.2, 6): one context class
for both, each over its own model's engine.

``GeneratorContext`` is the ``RoleContext`` a device slot shifts (``pivot.shifting``): KV
cache temporary, weights parameters (Read from GPS into ``reload_weights``), engine graphs
offloadable (none in eager mode), engine definition preserved. A slot keeps a policy
engine and a GenRM engine for the whole run (``shared_loop`` keys them by model); the one
whose role the slot does not play sleeps (``pivot.roles.engine.sleep``: weights and KV
cache released), from the context's build on. The slot's actor
(``pivot.runtime.slot.SlotActor``) holds it; tests and benchmarks that want an engine
behind an actor of its own use ``pivot.testing.generator.GeneratorActor``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from pivot.roles.engine.config import EngineConfig
from pivot.roles.engine.loop import shared_loop
from pivot.roles.engine.vllm_engine import ReleaseReport
from pivot.shifting.role_shift import ContextCategory
from pivot.types import MODEL_OF_ROLE, Role


def _asleep(engine) -> ReleaseReport:
    """Aborts what the engine still runs (a slot rebuilt after a failure) and puts it to
    sleep; a no-op on an engine already asleep."""
    engine.abort(list(engine.live))
    return engine.release()


@dataclass
class GeneratorContext:
    """The rollout or reward context of one device slot, over its model's engine.

    Rollout serves the policy, reward the GenRM (``MODEL_OF_ROLE``), each on the engine
    ``shared_loop`` keeps for that model in this process, started once and put to sleep
    here; ``cfg`` is that model's (its own folder, lengths, KV blocks). A shift down puts
    the engine to sleep (KV cache, then weights), a shift up wakes it (weights Read from
    GPS, then KV cache): never an engine start (sec. 5.2, preserved engine definition).
    """

    role: Role
    cfg: EngineConfig
    timings: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.role = Role.parse(self.role)
        self.model = MODEL_OF_ROLE[self.role]
        self.loop = shared_loop(self.model, self.cfg)
        self.holds_weights = False
        self.kv_up = False
        # A follower rank of a TP replica applies rank 0's engine calls, shift steps
        # included (pivot.roles.engine.mirror): its own context changes nothing
        self.is_follower = getattr(self.loop, "is_follower", False)
        # asleep until the first shift up Reads its weights (the start loaded the folder's)
        self.last_release: ReleaseReport | None = (
            None if self.is_follower else self.loop.call(_asleep))

    def discard(self, category: ContextCategory) -> None:
        if category is ContextCategory.TEMPORARY:
            self.kv_up = False
        elif category is ContextCategory.PARAMETERS:
            self.holds_weights = False
        if self.is_follower:
            return
        if category is ContextCategory.TEMPORARY:
            self.loop.call(lambda e: e.release_kv())
        elif category is ContextCategory.PARAMETERS:
            self.loop.call(lambda e: e.release_weights())
            self.holds_weights = False

    def offload(self, category: ContextCategory) -> None:
        """Engine graphs: none exist with ``enforce_eager`` (the CPU default here)."""

    def reload(self, category: ContextCategory) -> None:
        """Nothing was offloaded (see ``offload``)."""

    def reallocate(self, category: ContextCategory) -> None:
        self.kv_up = True
        if not self.is_follower:
            self.loop.call(lambda e: e.reallocate_kv())

    def load_parameters(self, state: Mapping[str, torch.Tensor]) -> None:
        if not self.is_follower:
            self.timings["load_weights"] = self.loop.call(lambda e: e.load_weights(state))
        self.holds_weights = True

    def _kv_allocated(self, st) -> bool:
        # a follower's engine lags rank 0's stream: it reports what its shifts asked for
        return self.kv_up if self.is_follower else st.kv_allocated

    @property
    def kv_capacity(self) -> int:
        # a follower answers without its engine's lock (held while it applies rank 0's
        # stream), from what its shifts asked for
        st = None if self.is_follower else self.loop.call(lambda e: e.stats())
        return self.cfg.kv_capacity if self._kv_allocated(st) else 0

    def describe(self) -> dict[str, Any]:
        st = self.loop.call(lambda e: e.stats())
        return {"kv_capacity": self.cfg.kv_capacity if self._kv_allocated(st) else 0,
                "tp_rank": (int(os.environ.get("RANK", "0"))
                            if self.cfg.tensor_parallel_size > 1 else None),
                "mirrored_calls": (self.loop.applied if self.is_follower
                                   else getattr(self.loop.engine, "sent", None)),
                # a follower's calls that failed here alone (rank 0's went through)
                "follower_failed": list(self.loop.failed) if self.is_follower else [],
                "weights_loaded": self.holds_weights and (self.is_follower
                                                          or st.weights_loaded),
                "model": self.model, "engine_start_s": self.loop.engine.start_s,
                "rss_bytes": st.rss_bytes, "engine": dataclasses.asdict(st)}
