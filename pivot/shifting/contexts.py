"""Role context objects: what a device slot holds for a role, by category (sec. 5.2).

A context implements one method per action of ``role_shift``'s tables; ``apply_steps``
walks a role's shift-down or shift-up steps and times each phase. Contexts are built once
per slot when the slot is spawned (their preserved part, e.g. an engine definition, lives
for the whole run) and are shifted, never rebuilt.

``InferenceContext`` and ``TrainingContext`` hold real torch state (tests, benchmarks); the
vLLM engine (``pivot.roles.generator.GeneratorContext``) and the torchtitan trainer
(``pivot.roles.trainer``) plug in by implementing ``RoleContext``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from pivot.errors import StateError
from pivot.shifting.params import StateDict
from pivot.shifting.role_shift import ContextCategory, ShiftAction, ShiftStep
from pivot.types import MODEL_OF_ROLE, Role


class RoleContext(Protocol):
    """One role's context in one slot."""

    role: Role
    model: str

    def discard(self, category: ContextCategory) -> None: ...
    def offload(self, category: ContextCategory) -> None: ...
    def reload(self, category: ContextCategory) -> None: ...
    def reallocate(self, category: ContextCategory) -> None: ...
    def load_parameters(self, state: StateDict) -> None: ...
    def describe(self) -> dict[str, Any]: ...


def apply_steps(ctx: RoleContext, steps: tuple[ShiftStep, ...],
                read: Callable[[], StateDict]) -> dict[str, float]:
    """Applies ``steps`` to ``ctx``; returns phase -> seconds.

    A READ step is split into ``gps_read`` (the transfer) and ``load_parameters``.
    KEEP steps cost nothing and are reported as 0 so every declared category shows up.
    """
    phases: dict[str, float] = {}
    for step in steps:
        t = time.perf_counter()
        if step.action is ShiftAction.DISCARD:
            ctx.discard(step.category)
        elif step.action is ShiftAction.OFFLOAD:
            ctx.offload(step.category)
        elif step.action is ShiftAction.RELOAD:
            ctx.reload(step.category)
        elif step.action is ShiftAction.REALLOCATE:
            ctx.reallocate(step.category)
        elif step.action is ShiftAction.READ:
            state = read()
            phases["gps_read"] = time.perf_counter() - t
            t = time.perf_counter()
            ctx.load_parameters(state)
            phases["load_parameters"] = time.perf_counter() - t
            continue
        phases[step.phase] = time.perf_counter() - t
    return phases


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclass
class InferenceContext:
    """Rollout or reward context: weights, a KV cache, engine graphs, engine definition.

    Without an engine, the context holds the weights and a KV cache tensor of
    ``kv_tokens * kv_bytes_per_token`` bytes itself. ``device`` is where "device memory"
    lives (``cpu`` here; ``cuda:N`` on a GPU host).
    """

    role: Role
    kv_tokens: int = 4096
    kv_bytes_per_token: int = 256
    device: str = "cpu"

    def __post_init__(self) -> None:
        self.role = Role.parse(self.role)
        if self.role is Role.TRAINING:
            raise StateError("InferenceContext: role must be rollout or reward, got training; "
                             "use TrainingContext")
        if self.kv_tokens <= 0 or self.kv_bytes_per_token <= 0:
            raise StateError(f"InferenceContext: kv_tokens and kv_bytes_per_token must be "
                             f"> 0, got {self.kv_tokens}, {self.kv_bytes_per_token}")
        self.model = MODEL_OF_ROLE[self.role]
        self.weights: StateDict | None = None
        self.kv_cache: torch.Tensor | None = None
        self.graphs: dict[str, torch.Tensor] = {}
        self.host_graphs: dict[str, torch.Tensor] = {}

    def discard(self, category: ContextCategory) -> None:
        if category is ContextCategory.TEMPORARY:
            self.kv_cache = None
        elif category is ContextCategory.PARAMETERS:
            self.weights = None

    def offload(self, category: ContextCategory) -> None:
        self.host_graphs = {k: v.to("cpu", copy=True) for k, v in self.graphs.items()}
        self.graphs = {}

    def reload(self, category: ContextCategory) -> None:
        self.graphs = {k: v.to(self.device, copy=True) for k, v in self.host_graphs.items()}
        self.host_graphs = {}

    def reallocate(self, category: ContextCategory) -> None:
        self.kv_cache = torch.empty(self.kv_tokens * self.kv_bytes_per_token,
                                    dtype=torch.uint8, device=self.device)

    def load_parameters(self, state: StateDict) -> None:
        self.weights = {k: v.to(self.device, copy=True) for k, v in state.items()}

    @property
    def kv_capacity(self) -> int:
        return self.kv_tokens if self.kv_cache is not None else 0

    def describe(self) -> dict[str, Any]:
        return {"weights_bytes": _nbytes((self.weights or {}).values()),
                "kv_bytes": 0 if self.kv_cache is None else self.kv_cache.numel(),
                "kv_capacity": self.kv_capacity}


@dataclass
class TinyMLP:
    """A picklable module factory for tests and benchmarks: Linear layers of ``sizes``."""

    sizes: tuple[int, ...] = (16, 32, 4)

    def __call__(self) -> nn.Module:
        layers: list[nn.Module] = []
        for a, b in zip(self.sizes, self.sizes[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        return nn.Sequential(*layers[:-1])


@dataclass
class TrainingContext:
    """Training context: module weights, AdamW state and gradients, activations.

    The module and optimizer are built once (preserved definitions); a shift down empties
    the weights in place (the Parameter objects survive, so the optimizer's state keys stay
    valid) and moves optimizer state and gradients to host memory.
    """

    module_factory: Callable[[], nn.Module]
    lr: float = 1e-3
    device: str = "cpu"

    def __post_init__(self) -> None:
        self.role = Role.TRAINING
        self.model = MODEL_OF_ROLE[Role.TRAINING]
        self.module = self.module_factory().to(self.device)
        self.shapes = {k: v.shape for k, v in self.module.state_dict().items()}
        self.optimizer = torch.optim.AdamW(self.module.parameters(), lr=self.lr)
        self.host_state: dict[int, dict[str, torch.Tensor]] = {}
        self.host_grads: dict[int, torch.Tensor] = {}
        self.loaded = False
        self.discard(ContextCategory.PARAMETERS)

    def _params(self) -> list[nn.Parameter]:
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    def discard(self, category: ContextCategory) -> None:
        if category is ContextCategory.PARAMETERS:
            for t in self.module.state_dict(keep_vars=True).values():
                t.data = torch.empty(0, dtype=t.dtype, device=self.device)
            self.loaded = False

    def offload(self, category: ContextCategory) -> None:
        params = self._params()
        for i, p in enumerate(params):
            st = self.optimizer.state.pop(p, None)
            if st:
                self.host_state[i] = {k: v.to("cpu", copy=True) for k, v in st.items()}
            if p.grad is not None:
                self.host_grads[i] = p.grad.to("cpu", copy=True)
                p.grad = None

    def reload(self, category: ContextCategory) -> None:
        params = self._params()
        for i, st in self.host_state.items():
            self.optimizer.state[params[i]] = {k: v.to(self.device, copy=True)
                                               for k, v in st.items()}
        for i, g in self.host_grads.items():
            params[i].grad = g.to(self.device, copy=True)
        self.host_state, self.host_grads = {}, {}

    def reallocate(self, category: ContextCategory) -> None:
        """Activations are rebuilt by the next forward pass; nothing to reserve."""

    def load_parameters(self, state: StateDict) -> None:
        own = self.module.state_dict(keep_vars=True)
        if set(state) != set(own):
            raise StateError(f"training load: parameter names differ; missing "
                             f"{sorted(set(own) - set(state))[:5]}, extra "
                             f"{sorted(set(state) - set(own))[:5]}")
        for k, t in own.items():
            if state[k].shape != self.shapes[k]:
                raise StateError(f"training load: {k} has shape {tuple(state[k].shape)}, the "
                                 f"module expects {tuple(self.shapes[k])}")
            t.data = state[k].to(self.device, copy=True)
        self.loaded = True

    def train_step(self, seed: int, batch: int = 8) -> float:
        """One AdamW step on a random regression batch; returns the loss."""
        if not self.loaded:
            raise StateError("train_step: training is shifted down (no weights); shift up first")
        g = torch.Generator().manual_seed(seed)
        first = next(iter(self.shapes.values()))
        x = torch.randn(batch, first[1], generator=g)
        y = self.module(x.to(self.device))
        loss = (y ** 2).mean()
        self.optimizer.zero_grad(set_to_none=False)
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())

    @property
    def weights(self) -> StateDict:
        return {k: v.detach() for k, v in self.module.state_dict().items()} if self.loaded else {}

    def optimizer_tensors(self) -> dict[str, torch.Tensor]:
        """Every optimizer state tensor, keyed ``<param index>.<name>``, on the device."""
        params = self._params()
        return {f"{i}.{k}": v for i, p in enumerate(params)
                for k, v in self.optimizer.state.get(p, {}).items() if torch.is_tensor(v)}

    def gradient_tensors(self) -> dict[str, torch.Tensor]:
        """Every parameter's gradient, keyed by parameter index, on the device."""
        return {str(i): p.grad for i, p in enumerate(self._params()) if p.grad is not None}

    def describe(self) -> dict[str, Any]:
        return {"weights_bytes": _nbytes(self.weights.values()),
                "optimizer_bytes": _nbytes(self.optimizer_tensors().values()),
                "offloaded_bytes": _nbytes(v for s in self.host_state.values()
                                           for v in s.values()) + _nbytes(self.host_grads.values()),
                "kv_capacity": 0}
