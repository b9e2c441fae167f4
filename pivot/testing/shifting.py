"""Role contexts holding real torch state, and an in-process parameter source (tests and
benchmarks only; see ``pivot.testing``).

``InferenceContext`` and ``TrainingContext`` implement ``pivot.shifting.contexts.RoleContext``
over plain tensors and a ``TinyMLP``, so the shift tables, the device slot and the mesh
controller can be exercised without vLLM or torchtitan (the product contexts are
``pivot.roles.engine.slot_context`` and ``pivot.roles.trainer_context``).
``InMemoryParameterSource`` is a ``ParameterSource`` holding every model fully replicated
in this process, standing in for the Global Parameter Storage.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pivot.errors import StateError
from pivot.shifting.params import StateDict, tensor_bytes
from pivot.shifting.role_shift import ContextCategory
from pivot.types import MODEL_OF_ROLE, Role


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
        return {"weights_bytes": tensor_bytes((self.weights or {}).values()),
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
        return {"weights_bytes": tensor_bytes(self.weights.values()),
                "optimizer_bytes": tensor_bytes(self.optimizer_tensors().values()),
                "offloaded_bytes": (tensor_bytes(v for s in self.host_state.values()
                                                 for v in s.values())
                                    + tensor_bytes(self.host_grads.values())),
                "kv_capacity": 0}


def tiny_mlp_state(sizes: tuple[int, ...], seed: int) -> StateDict:
    """The state dict of a freshly initialised ``TinyMLP(sizes)`` under torch seed ``seed``."""
    torch.manual_seed(seed)
    return {k: v.detach().clone() for k, v in TinyMLP(sizes)().state_dict().items()}


class InMemoryParameterSource:
    """Every model fully replicated in this process's memory (layout None only)."""

    def __init__(self, models: Mapping[str, StateDict]):
        self._models = {m: {k: v.detach().clone() for k, v in sd.items()}
                        for m, sd in models.items()}

    def models(self) -> tuple[str, ...]:
        return tuple(self._models)

    def read(self, model: str, devices: tuple[int, ...],
             layout: Any = None) -> dict[int, StateDict]:
        sd = self._model(model, layout, "read")
        return {d: {k: v.clone() for k, v in sd.items()} for d in devices}

    def write(self, model: str, devices: tuple[int, ...], layout: Any,
              tensors: Mapping[int, StateDict]) -> None:
        sd = self._model(model, layout, "write")
        if not devices:
            raise StateError(f"write of {model}: no devices given")
        new = tensors[devices[0]]
        if set(new) != set(sd):
            raise StateError(f"write of {model}: names differ from the stored model; missing "
                             f"{sorted(set(sd) - set(new))[:5]}, extra "
                             f"{sorted(set(new) - set(sd))[:5]}")
        for k, v in new.items():
            if v.shape != sd[k].shape or v.dtype != sd[k].dtype:
                raise StateError(f"write of {model}: {k} is {tuple(v.shape)} {v.dtype}, "
                                 f"stored {tuple(sd[k].shape)} {sd[k].dtype}")
        self._models[model] = {k: v.detach().clone() for k, v in new.items()}

    def _model(self, model: str, layout: Any, op: str) -> StateDict:
        if layout is not None:
            raise StateError(f"{op} of {model}: InMemoryParameterSource holds replicated "
                             f"models only; pass layout=None or use pivot.gps")
        try:
            return self._models[model]
        except KeyError:
            raise StateError(f"{op}: unknown model {model!r}; the source holds "
                             f"{sorted(self._models)}") from None
