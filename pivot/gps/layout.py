"""Layouts of the Global Parameter Storage (paper sec. 5.1, appendix B.1).

Two layouts meet in every Read and Write:

* the caller's parallelism layout ``P`` (:class:`ParallelLayout`): DP x PP x TP over the
  devices ``G``; TP splits each parameter along its own dimension (column-parallel weights
  on dim 0, row-parallel on dim 1, ``None`` = replicated, e.g. norms); PP assigns layers to
  stages contiguously;
* the GPS storage layout (:class:`StorageLayout`): replication-first (every host holds every
  model) when the per-host budget allows, else HSDP-like groups of the smallest size ``k``
  that fits, sharded inside a group and replicated across groups (appendix B.1).

Sharding inside a group (our choice, the paper does not fix one): a tensor whose dim 0 has
at least ``k`` rows and whose size is at least ``min_split_bytes`` is cut along dim 0 into
``k`` contiguous row ranges (``numpy.array_split`` sizes: a dim of 10 over 4 shards gives
3, 3, 2, 2 rows), which balances bytes almost exactly and spreads a Read over all ``k``
hosts; smaller tensors stay whole and go to the group slot with the fewest bytes so far
(largest first), because a row range of a norm vector is not worth a transfer of its own.

Boxes are n-dimensional half-open index ranges, ``((start0, stop0), (start1, stop1), ...)``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from pivot.errors import ConfigError

Box = tuple[tuple[int, int], ...]

_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
           "float64": torch.float64, "int64": torch.int64, "int32": torch.int32,
           "uint8": torch.uint8, "int8": torch.int8}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype named ``name`` (e.g. ``"float32"``)."""
    try:
        return _DTYPES[name]
    except KeyError:
        raise ConfigError(f"unknown dtype {name!r}; expected one of {sorted(_DTYPES)}") from None


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True, slots=True)
class ParamMeta:
    """Name, shape and dtype of one parameter (Hugging Face naming)."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def itemsize(self) -> int:
        return torch_dtype(self.dtype).itemsize

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.itemsize

    @property
    def layer(self) -> int | None:
        """The decoder layer index in the name, or None for embed / final norm / lm_head."""
        m = _LAYER_RE.search(self.name)
        return int(m.group(1)) if m else None


@dataclass(frozen=True, slots=True)
class ModelMeta:
    """The parameters of one model ``M``: its name and every tensor's shape and dtype."""

    name: str
    params: tuple[ParamMeta, ...]
    _num_layers: int = field(default=0, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        layers = [p.layer for p in self.params if p.layer is not None]
        object.__setattr__(self, "_num_layers", max(layers) + 1 if layers else 1)
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise ConfigError(f"model {self.name!r}: duplicate parameter names")
        for p in self.params:
            if not p.shape or any(s <= 0 for s in p.shape):
                raise ConfigError(f"model {self.name!r}: parameter {p.name!r} has shape "
                                  f"{p.shape}; every dim must be > 0")
            torch_dtype(p.dtype)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.params)

    @property
    def num_layers(self) -> int:
        return self._num_layers

    @classmethod
    def from_state_dict(cls, name: str, state: Mapping[str, torch.Tensor]) -> "ModelMeta":
        return cls(name, tuple(ParamMeta(k, tuple(v.shape), dtype_name(v.dtype))
                               for k, v in state.items()))


def qwen3_split_dim(name: str, shape: Sequence[int]) -> int | None:
    """Default TP split dim of a Hugging Face Qwen3 parameter (Megatron convention).

    q/k/v/gate/up projections are column-parallel (dim 0), o/down row-parallel (dim 1),
    embeddings and lm_head are vocabulary-parallel (dim 0); norms and biases of row-parallel
    layers are replicated (None).
    """
    if len(shape) < 2:
        if re.search(r"(q_proj|k_proj|v_proj|gate_proj|up_proj)\.bias$", name):
            return 0
        return None
    if re.search(r"(q_proj|k_proj|v_proj|gate_proj|up_proj)\.weight$", name):
        return 0
    if re.search(r"(o_proj|down_proj)\.weight$", name):
        return 1
    if re.search(r"(embed_tokens|lm_head)\.weight$", name):
        return 0
    return None


def qwen3_model(name: str, *, layers: int, hidden: int, intermediate: int, heads: int,
                kv_heads: int, head_dim: int, vocab: int, dtype: str = "float32",
                tie_embeddings: bool = False) -> ModelMeta:
    """A Qwen3-shaped parameter list (HF naming), for benchmarks and tests."""
    ps: list[ParamMeta] = [ParamMeta("model.embed_tokens.weight", (vocab, hidden), dtype)]
    for i in range(layers):
        pre = f"model.layers.{i}."
        ps += [
            ParamMeta(pre + "input_layernorm.weight", (hidden,), dtype),
            ParamMeta(pre + "self_attn.q_proj.weight", (heads * head_dim, hidden), dtype),
            ParamMeta(pre + "self_attn.k_proj.weight", (kv_heads * head_dim, hidden), dtype),
            ParamMeta(pre + "self_attn.v_proj.weight", (kv_heads * head_dim, hidden), dtype),
            ParamMeta(pre + "self_attn.o_proj.weight", (hidden, heads * head_dim), dtype),
            ParamMeta(pre + "self_attn.q_norm.weight", (head_dim,), dtype),
            ParamMeta(pre + "self_attn.k_norm.weight", (head_dim,), dtype),
            ParamMeta(pre + "post_attention_layernorm.weight", (hidden,), dtype),
            ParamMeta(pre + "mlp.gate_proj.weight", (intermediate, hidden), dtype),
            ParamMeta(pre + "mlp.up_proj.weight", (intermediate, hidden), dtype),
            ParamMeta(pre + "mlp.down_proj.weight", (hidden, intermediate), dtype),
        ]
    ps.append(ParamMeta("model.norm.weight", (hidden,), dtype))
    if not tie_embeddings:
        ps.append(ParamMeta("lm_head.weight", (vocab, hidden), dtype))
    return ModelMeta(name, tuple(ps))


@dataclass(frozen=True, slots=True)
class ParallelLayout:
    """The caller's parallelism ``P`` (sec. 5.1): DP x PP x TP, TP innermost.

    Device ``G[r]`` has coordinates ``dp = r // (pp*tp)``, ``stage = (r // tp) % pp``,
    ``tp = r % tp``. ``split_dims`` lists, per parameter, the dim TP splits (None:
    replicated); a parameter missing from it is replicated. ``owners`` lists parameters
    held whole by one TP rank only (an MoE's experts under expert parallelism: the
    expert's rank holds all of it, the others none); their split dim is None.
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    split_dims: tuple[tuple[str, int | None], ...] = ()
    owners: tuple[tuple[str, int], ...] = ()
    _hash: int = field(default=0, compare=False, repr=False)
    _owner_of: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for k in ("dp", "tp", "pp"):
            v = getattr(self, k)
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"ParallelLayout.{k} must be an int >= 1, got {v!r}")
        split = dict(self.split_dims)
        for name, r in self.owners:
            if not isinstance(r, int) or not 0 <= r < self.tp:
                raise ConfigError(f"ParallelLayout.owners: {name} owned by TP rank {r!r}, "
                                  f"outside TP={self.tp}")
            if split.get(name) is not None:
                raise ConfigError(f"ParallelLayout.owners: {name} is also split along dim "
                                  f"{split[name]}; a parameter one rank owns is held whole")
        object.__setattr__(self, "_hash", hash((self.dp, self.tp, self.pp, self.split_dims,
                                                self.owners)))
        object.__setattr__(self, "_owner_of", dict(self.owners))

    def __hash__(self) -> int:
        return self._hash

    @classmethod
    def create(cls, model: ModelMeta, *, dp: int = 1, tp: int = 1, pp: int = 1,
               split_dim: Callable[[str, Sequence[int]], int | None] = qwen3_split_dim,
               owner: Callable[[str], int | None] | None = None) -> "ParallelLayout":
        """A layout for ``model`` whose split dims come from ``split_dim(name, shape)`` and
        whose single-rank parameters (None: every rank's) from ``owner(name)``."""
        owners = () if owner is None else tuple(
            (p.name, r) for p in model.params if (r := owner(p.name)) is not None)
        return cls(dp, tp, pp, tuple((p.name, split_dim(p.name, p.shape))
                                     for p in model.params), owners)

    def holds(self, name: str, tp_rank: int) -> bool:
        """Whether a device of TP coordinate ``tp_rank`` holds (part of) ``name``."""
        return self._owner_of.get(name, tp_rank) == tp_rank

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(dp, stage, tp) of device rank ``rank``."""
        return rank // (self.pp * self.tp), (rank // self.tp) % self.pp, rank % self.tp


def param_stage(p: ParamMeta, num_layers: int, pp: int) -> int:
    """PP stage of a parameter: layers split contiguously and evenly, embeddings on the first
    stage, the final norm and lm_head on the last (other non-layer tensors: first)."""
    if p.layer is not None:
        return min(p.layer * pp // num_layers, pp - 1)
    if p.name.startswith("lm_head") or p.name in ("model.norm.weight", "norm.weight"):
        return pp - 1
    return 0


def chunk_bounds(n: int, parts: int) -> np.ndarray:
    """Bounds of ``numpy.array_split(range(n), parts)``: ``parts + 1`` ints."""
    base, extra = divmod(n, parts)
    sizes = np.full(parts, base, dtype=np.int64)
    sizes[:extra] += 1
    return np.concatenate([[0], np.cumsum(sizes)])


@dataclass(frozen=True, slots=True)
class ParamShards:
    """How GPS cuts one parameter inside a group: row ranges along dim 0, each on a slot.

    ``rows[i]`` is the half-open row range of shard ``i`` and ``slots[i]`` the group slot
    (0..k-1) that holds it; host ``g*k + slot`` holds it in every group ``g``.
    """

    rows: tuple[tuple[int, int], ...]
    slots: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StorageLayout:
    """Where GPS keeps every model (appendix B.1): ``hosts`` hosts in groups of ``k``."""

    hosts: int
    k: int
    shards: tuple[tuple[str, tuple[tuple[str, ParamShards], ...]], ...]

    @property
    def groups(self) -> int:
        return self.hosts // self.k

    def param_shards(self, model: str) -> dict[str, ParamShards]:
        for m, ps in self.shards:
            if m == model:
                return dict(ps)
        known = ", ".join(m for m, _ in self.shards)
        raise ConfigError(f"GPS holds no model {model!r} (it holds: {known}); add it to the "
                          f"models given to plan_storage")

    def holders(self, slot: int) -> list[int]:
        return [g * self.k + slot for g in range(self.groups)]

    def host_bytes(self, models: Mapping[str, ModelMeta]) -> list[int]:
        """Bytes each host holds."""
        out = [0] * self.hosts
        for m, ps in self.shards:
            meta = {p.name: p for p in models[m].params}
            for name, sh in ps:
                p = meta[name]
                row = p.nbytes // p.shape[0]
                for (a, b), s in zip(sh.rows, sh.slots):
                    for h in self.holders(s):
                        out[h] += (b - a) * row
        return out


def _shard_models(models: Sequence[ModelMeta], k: int, min_split_bytes: int
                  ) -> tuple[list[tuple[str, tuple[tuple[str, ParamShards], ...]]], np.ndarray]:
    load = np.zeros(k, dtype=np.int64)
    whole: list[tuple[int, str, ParamMeta]] = []
    out: dict[str, dict[str, ParamShards]] = {m.name: {} for m in models}
    for m in models:
        for p in m.params:
            if k > 1 and p.shape[0] >= k and p.nbytes >= min_split_bytes:
                b = chunk_bounds(p.shape[0], k)
                row = p.nbytes // p.shape[0]
                load += np.diff(b) * row
                out[m.name][p.name] = ParamShards(
                    tuple((int(b[i]), int(b[i + 1])) for i in range(k)), tuple(range(k)))
            else:
                whole.append((p.nbytes, m.name, p))
    for nbytes, mname, p in sorted(whole, key=lambda t: -t[0]):
        s = int(np.argmin(load))
        load[s] += nbytes
        out[mname][p.name] = ParamShards(((0, p.shape[0]),), (s,))
    shards = [(m.name, tuple((p.name, out[m.name][p.name]) for p in m.params)) for m in models]
    return shards, load


def plan_storage(models: Sequence[ModelMeta], hosts: int, budget_bytes: int, *,
                 min_split_bytes: int = 1 << 20) -> StorageLayout:
    """The GPS storage layout (appendix B.1): the smallest group size ``k`` (dividing
    ``hosts``, so every group is whole) whose most loaded host fits ``budget_bytes``;
    ``k = 1`` is full replication.

    Raises:
        ConfigError: before anything is stored, if even ``k = hosts`` does not fit.
    """
    if hosts < 1:
        raise ConfigError(f"plan_storage: hosts must be >= 1, got {hosts}")
    if not models:
        raise ConfigError("plan_storage: no models given")
    if budget_bytes <= 0:
        raise ConfigError(f"plan_storage: budget_bytes must be > 0, got {budget_bytes}")
    for k in (d for d in range(1, hosts + 1) if hosts % d == 0):
        shards, load = _shard_models(models, k, min_split_bytes)
        if int(load.max()) <= budget_bytes:
            return StorageLayout(hosts, k, tuple(shards))
    sizes = ", ".join(f"{m.name}={m.nbytes / 2**30:.2f} GiB" for m in models)
    total = sum(m.nbytes for m in models)
    raise ConfigError(
        f"GPS does not fit: a per-host budget of {budget_bytes / 2**30:.2f} GiB cannot hold "
        f"the models ({sizes}; {total / 2**30:.2f} GiB in all) even fully sharded over "
        f"{hosts} hosts (the most loaded host would need {int(load.max()) / 2**30:.2f} GiB); "
        f"raise the per-host budget, add hosts, or store fewer models")
