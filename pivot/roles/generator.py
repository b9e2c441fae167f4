"""The generator replica of the rollout and reward roles (sec. 5.2, 6): one context class
for both, since policy and GenRM share an architecture (``pivot.models.config``).

``GeneratorContext`` is the ``RoleContext`` a device slot shifts (``pivot.shifting``): KV
cache temporary, weights parameters (Read from GPS into ``reload_weights``), engine graphs
offloadable (none in eager mode), engine definition preserved. The slot's actor
(``pivot.runtime.slot.SlotActor``) holds it; tests and benchmarks that want an engine
behind an actor of its own use ``pivot.testing.generator.GeneratorActor``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from pivot.roles.engine.config import EngineConfig
from pivot.roles.engine.loop import shared_loop
from pivot.roles.engine.vllm_engine import ReleaseReport
from pivot.shifting.role_shift import ContextCategory
from pivot.types import MODEL_OF_ROLE, Role


@dataclass
class GeneratorContext:
    """The rollout or reward context of one device slot, over the slot's shared engine.

    Both roles' contexts in a slot share one engine (``shared_loop``): a shift between
    them releases and Reads weights, never restarts vLLM (sec. 5.2, preserved engine
    definition).
    """

    role: Role
    cfg: EngineConfig
    timings: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.role = Role.parse(self.role)
        self.model = MODEL_OF_ROLE[self.role]
        self.loop = shared_loop(self.cfg)
        self.last_release: ReleaseReport | None = None
        self.holds_weights = False

    def discard(self, category: ContextCategory) -> None:
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
        self.loop.call(lambda e: e.reallocate_kv())

    def load_parameters(self, state: Mapping[str, torch.Tensor]) -> None:
        self.timings["load_weights"] = self.loop.call(lambda e: e.load_weights(state))
        self.holds_weights = True

    @property
    def kv_capacity(self) -> int:
        allocated = self.loop.call(lambda e: e.stats().kv_allocated)
        return self.cfg.kv_capacity if allocated else 0

    def describe(self) -> dict[str, Any]:
        st = self.loop.call(lambda e: e.stats())
        return {"kv_capacity": self.cfg.kv_capacity if st.kv_allocated else 0,
                "weights_loaded": st.weights_loaded and self.holds_weights,
                "rss_bytes": st.rss_bytes, "engine": dataclasses.asdict(st)}
