"""The training role: torchtitan Qwen3 / Qwen2 + GRPO on FSDP2 (sec. 5.2, 8.1).

``Trainer`` is a plain class that imports no Monarch (``pivot.roles.trainer_actor`` is the
thin Monarch actor around it, one per training proc). It runs on the CPU over gloo, or on
this process's GPU (``Config.device``) over the group it is given, in fp32 or bf16
(``Config.precision``), built whole or on the meta device (``Config.meta_init``). Data
flow of one RL step::

    GPS Read (HF names) --load_hf_state_dict--> model (FSDP2 shards)
    TrainBatch --compute_logprobs--> [B, L] log-probs (optional, e.g. for old_logprobs)
    TrainBatch --forward_backward--> grads (+ metrics)      } repeated for accumulation
               --optim_step-------> AdamW update, version += 1
    state_dict_hf() --> full HF-named tensors --> GPS Write

Shifting (sec. 5.2): ``offload()``/``reload()`` move optimizer state and gradients to host
buffers and back bit-exactly; ``release_parameters()`` frees the weights (they come back
through ``load_hf_state_dict`` from a GPS Read); ``context_items()`` lists what the role
holds by category.

Data parallelism: every rank receives the whole batch and trains on its contiguous slice
of rows. Each rank's loss is its token-loss sum divided by the *global* response-token
count, and FSDP reduces gradients by plain SUM (``set_force_sum_reduction_for_comms`` as
gloo has no PREMUL_SUM, and a gradient divide factor of 1), so the summed gradient is
exactly the single-process gradient of DAPO's token-mean loss.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, distribute_tensor

from pivot.errors import ConfigError, StateError
from pivot.losses.grpo import GRPOLoss, token_logprobs
from pivot.rl.batch import TrainBatch
from pivot.roles.titan.context import HostStash, local_tensor, storage_bytes
from pivot.roles.titan.family import family_of
from pivot.roles.titan.sharding import build_on_meta, fully_shard_blocks, mixed_precision_policy

logger = logging.getLogger(__name__)

__all__ = ["Trainer"]


class Trainer:
    """Policy trainer on one rank (single process, or one FSDP2 rank over gloo)."""

    @dataclass(kw_only=True, slots=True)
    class Optimizer:
        lr: float
        """No default: the caller's (``OptimizerConfig.lr`` in a run, passed through)."""
        betas: tuple[float, float] = (0.9, 0.999)
        eps: float = 1e-8
        weight_decay: float = 0.01
        max_grad_norm: float = 1.0
        """Global gradient-norm clip before each step; 0 disables it."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        model: str | Path | dict
        """A HF Qwen3 or Qwen2 model folder, its config.json, or the config dict."""
        max_seq_len: int = 2048
        """RoPE cache length; batches longer than this are rejected."""
        seed: int = 0
        """Seed of the random initial weights (normally overwritten by a GPS Read)."""
        optimizer: "Trainer.Optimizer"
        loss: GRPOLoss.Config = field(default_factory=GRPOLoss.Config)
        fsdp: bool = True
        """Shard with FSDP2 when a process group of more than one rank is initialised."""
        device: str = "cpu"
        """``cpu``, or ``cuda``: this process's current CUDA device (a slot sees one GPU,
        ``Backend.slot_env``). Batches are moved there; results come back on the CPU."""
        precision: str = "fp32"
        """``fp32``, or ``bf16``: fp32 master weights and AdamW state, bf16 compute
        (``pivot.roles.titan.sharding``)."""
        meta_init: bool = False
        """Build on the meta device and allocate only this rank's shards; the weights are
        undefined until loaded (a GPS Read, or ``load_hf_rows``). Off: the model is built
        whole from ``seed`` and then sharded (the same initial weights on any rank count).
        """

    def __init__(self, config: Config) -> None:
        self.config = config
        self.family = family_of(config.model)   # Qwen3 (tiny policy) or Qwen2 (paper's)
        self.shape = self.family.shape(config.model)
        if config.max_seq_len <= 0:
            raise ConfigError(f"Trainer.Config.max_seq_len must be > 0, got "
                              f"{config.max_seq_len}")
        self.model_config = self.family.model_config(
            self.shape, min(config.max_seq_len, self.shape.max_position_embeddings))
        self.device = _resolve_device(config.device)
        self.mp_policy = mixed_precision_policy(config.precision)
        self.adapter = self.family.adapter(self.model_config)
        self.loss_fn = GRPOLoss(config.loss)
        self.model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.version = 0
        self.rank, self.world_size = 0, 1
        self.group: Any = None
        """The data-parallel group (None: the default group, or a single process)."""
        self._stash = HostStash()
        self._released: list[tuple[torch.Tensor, int]] = []
        self._activation_bytes = 0

    # ---------------------------------------------------------------- building
    def setup(self, group: Any = None, mesh: Any = None) -> dict[str, Any]:
        """Builds the model (FSDP2-sharded when distributed) and AdamW.

        Args:
            group: the data-parallel process group (None: the default group, when one of
                more than one rank is initialised, else a single process). Called again
                with another group, it rebuilds the model and optimizer for it (training
                moved to other devices, sec. 5.2): parameters come back by
                ``load_hf_state_dict`` and optimizer state by ``load_optimizer_state``.
            mesh: the 1-D device mesh over ``group`` (required with ``group``;
                ``pivot.compat.torch_dist.side_group_mesh``).
        """
        t0 = time.perf_counter()
        if group is not None:
            if mesh is None:
                raise ConfigError("Trainer.setup: a process group needs its device mesh "
                                  "(pivot.compat.torch_dist.side_group_mesh(group))")
            self.rank, self.world_size = group.rank(), group.size()
        elif dist.is_available() and dist.is_initialized():
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        else:
            self.rank, self.world_size = 0, 1
        self.group = group
        sharded = self.world_size > 1 and self.config.fsdp
        if sharded and mesh is None:
            from torch.distributed.device_mesh import init_device_mesh
            mesh = init_device_mesh(self.device.type, (self.world_size,),
                                    mesh_dim_names=("fsdp",))
        if self.config.meta_init:
            model = build_on_meta(self.model_config, device=self.device,
                                  seed=self.config.seed, mesh=mesh if sharded else None,
                                  mp_policy=self.mp_policy)
        else:
            model = self.family.build(self.model_config, seed=self.config.seed)
            model.to(self.device)
            if sharded:
                fully_shard_blocks(model, mesh, self.mp_policy)
        self.sharded = sharded
        self.model = model
        self._stash, self._released = HostStash(), []
        opt = self.config.optimizer
        self.optimizer = torch.optim.AdamW(
            model.parameters(), lr=opt.lr, betas=opt.betas, eps=opt.eps,
            weight_decay=opt.weight_decay, foreach=False)
        return {"trainer/setup/seconds": time.perf_counter() - t0,
                "trainer/setup/world_size": self.world_size,
                "trainer/setup/param_bytes": storage_bytes(model.parameters())}

    def _require_model(self, what: str) -> torch.nn.Module:
        if self.model is None:
            raise StateError(f"Trainer.{what}: call setup() first")
        if self._released:
            raise StateError(f"Trainer.{what}: parameters were released on a shift down; "
                             f"load_hf_state_dict(...) from a GPS Read first")
        if self._stash:
            raise StateError(f"Trainer.{what}: optimizer state is offloaded; call reload()")
        return self.model

    # ---------------------------------------------------------------- weights
    def load_hf_state_dict(self, hf_state_dict: Mapping[str, torch.Tensor]) -> dict[str, Any]:
        """Loads full HF-named tensors (a GPS Read) into the (sharded) model.

        Every rank passes the full tensors; each keeps its own shard (no communication).
        Also brings back parameters released by ``release_parameters``.
        """
        if self.model is None:
            raise StateError("Trainer.load_hf_state_dict: call setup() first")
        t0 = time.perf_counter()
        titan = self._fuse_qkv(self.adapter.from_hf(dict(hf_state_dict)))
        params = dict(self.model.named_parameters(remove_duplicate=False))
        missing = sorted(set(params) - set(titan))
        unexpected = sorted(set(titan) - set(params))
        if missing or unexpected:
            raise StateError(f"Trainer.load_hf_state_dict: HF tensors do not match the model "
                             f"built from {self.config.model!r}: missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}")
        for name, p in params.items():
            if tuple(titan[name].shape) != tuple(p.shape):
                raise StateError(f"Trainer.load_hf_state_dict: {name} has shape "
                                 f"{tuple(titan[name].shape)}, the model expects "
                                 f"{tuple(p.shape)}")
        self._restore_released()
        with torch.no_grad():
            for name, p in params.items():
                src = titan[name].detach().to(dtype=p.dtype, device=self.device)
                if isinstance(p, DTensor):
                    src = distribute_tensor(src, p.device_mesh, p.placements,
                                            src_data_rank=None).to_local()
                local_tensor(p).copy_(src)
        return {"trainer/load/seconds": time.perf_counter() - t0}

    def load_hf_rows(self, reader: Any) -> dict[str, Any]:
        """Fills this rank's shards from ``reader`` (``pivot.roles.titan.hf_shards``: a HF
        checkpoint read by slices, or a Read's rows): each rank reads only its own rows of
        every HF tensor, never a full one. Also brings back released parameters."""
        from pivot.roles.titan.hf_shards import load_hf_shards

        if self.model is None:
            raise StateError("Trainer.load_hf_rows: call setup() first")
        t0 = time.perf_counter()
        self._restore_released()
        n = load_hf_shards(self.model, self.adapter, reader)
        return {"trainer/load/seconds": time.perf_counter() - t0, "trainer/load/bytes": n}

    def hf_shards(self) -> list[Any]:
        """This rank's rows of every HF tensor (``HFShard`` views, no copy, no collective):
        the pieces of a per-rank Write; across ranks they cover every row exactly once."""
        from pivot.roles.titan.hf_shards import hf_shards

        return hf_shards(self._require_model("hf_shards"), self.adapter)

    def _restore_released(self) -> None:
        for t, n in self._released:
            local_tensor(t).untyped_storage().resize_(n)
        self._released.clear()

    def _fuse_qkv(self, titan: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Names of the state dict -> names of the parameters (fused ``wqkv``).

        torchtitan saves the fused QKV projection split into wq/wk/wv (a state-dict hook);
        the parameters hold it fused, so the split tensors are merged the way the model's
        own load hook does.
        """
        from pivot.compat.torchtitan import merge_fused_qkv

        assert self.model is not None
        return merge_fused_qkv(self.model, titan)

    def state_dict_hf(self) -> dict[str, torch.Tensor]:
        """Full (unsharded) HF-named tensors for a GPS Write. Collective under FSDP."""
        model = self._require_model("state_dict_hf")
        from pivot.roles.titan.gather import gather_full

        sd = model.state_dict()
        with torch.no_grad():
            full = dict(zip(sd, gather_full(list(sd.values()))))
        return self.adapter.to_hf(full)

    def release_parameters(self) -> dict[str, Any]:
        """Shift down: frees the rank-local parameter storage (GPS holds the weights)."""
        if self.model is None:
            raise StateError("Trainer.release_parameters: call setup() first")
        if self._released:
            return {"trainer/release/bytes": 0}
        seen, total = set(), 0
        for p in self.model.parameters():
            s = local_tensor(p).untyped_storage()
            if s.data_ptr() in seen or s.nbytes() == 0:
                continue
            seen.add(s.data_ptr())
            self._released.append((p, s.nbytes()))
            total += s.nbytes()
            s.resize_(0)
        return {"trainer/release/bytes": total}

    # ---------------------------------------------------------------- shifting
    def full_optimizer_state(self) -> dict[str, Any]:
        """AdamW state by parameter name with full tensors (``titan.optim_state``), on
        every rank. Collective under FSDP."""
        from pivot.roles.titan.optim_state import full_state

        model = self._require_model("full_optimizer_state")
        assert self.optimizer is not None
        return full_state(model, self.optimizer)

    def load_optimizer_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """Replaces AdamW's state with ``state`` from ``full_optimizer_state`` (from any
        number of ranks); each rank keeps its shard. Drops offloaded state (superseded)."""
        from pivot.roles.titan.optim_state import load_full_state

        if self.model is None or self.optimizer is None:
            raise StateError("Trainer.load_optimizer_state: call setup() first")
        t0 = time.perf_counter()
        self._stash = HostStash()
        n = load_full_state(self.model, self.optimizer, state)
        return {"trainer/optim_load/params": n,
                "trainer/optim_load/seconds": time.perf_counter() - t0}

    def _offloadable(self) -> list[torch.Tensor]:
        assert self.model is not None and self.optimizer is not None
        out = [t for st in self.optimizer.state.values() for t in st.values()
               if isinstance(t, torch.Tensor)]
        out += [p.grad for p in self.model.parameters() if p.grad is not None]
        return out

    def offload(self) -> dict[str, Any]:
        """Moves optimizer state and gradients to host buffers and frees the originals."""
        if self.model is None:
            raise StateError("Trainer.offload: call setup() first")
        if self._stash:
            raise StateError("Trainer.offload: already offloaded; call reload() first")
        nbytes, secs = self._stash.offload(self._offloadable())
        return {"trainer/offload/bytes": nbytes, "trainer/offload/seconds": secs}

    def reload(self) -> dict[str, Any]:
        """Brings the offloaded optimizer state and gradients back, bit-identical."""
        nbytes, secs = self._stash.reload()
        return {"trainer/reload/bytes": nbytes, "trainer/reload/seconds": secs}

    def context_items(self) -> list[tuple[str, str, int]]:
        """(name, category, rank-local bytes) of what the role holds (sec. 5.2).

        Sizes are logical: an offloaded or released item keeps its size. The preserved
        items (process group, model definition) are host objects with no tensor bytes.
        """
        if self.model is None or self.optimizer is None:
            raise StateError("Trainer.context_items: call setup() first")
        params = (sum(n for _, n in self._released) if self._released
                  else storage_bytes(self.model.parameters()))
        opt_t = [t for st in self.optimizer.state.values() for t in st.values()
                 if isinstance(t, torch.Tensor)]
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        stashed = self._stash.nbytes
        return [
            ("activations", "temporary", self._activation_bytes),
            ("rope_cache", "temporary", storage_bytes(self.model.buffers())),
            ("model.parameters", "parameters", params),
            ("optimizer.state", "offloadable", stashed or storage_bytes(opt_t)),
            ("gradients", "offloadable", 0 if stashed else storage_bytes(grads)),
            ("process_group", "preserved", 0),
            ("model.definition", "preserved", 0),
        ]

    # ---------------------------------------------------------------- training
    def _my_rows(self, batch: TrainBatch) -> TrainBatch:
        if batch.num_rows < self.world_size:
            raise ValueError(f"TrainBatch has {batch.num_rows} rows but the trainer has "
                             f"{self.world_size} data-parallel ranks; send >= 1 row a rank")
        bounds = torch.tensor_split(torch.arange(batch.num_rows), self.world_size)[self.rank]
        return batch.rows(slice(int(bounds[0]), int(bounds[-1]) + 1))

    def _logprobs(self, model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
        if self.mp_policy is not None and not self.sharded:  # one rank: bf16 by autocast
            with torch.autocast(self.device.type, dtype=torch.bfloat16):
                logits = model(ids)
        else:
            logits = model(ids)
        return token_logprobs(logits, ids)

    def compute_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """[B, L] fp32 log-probs of ``batch.input_ids`` under the current weights.

        Column t is log p(ids[t] | ids[:t]); column 0 is 0 and padded positions are
        meaningless. Under FSDP each rank computes its rows and the result is gathered.
        """
        model = self._require_model("compute_logprobs")
        batch.check(self.shape.vocab_size, self.model_config.layers[0].attention.rope.max_seq_len)
        mine = self._my_rows(batch)
        with torch.no_grad():
            lp = self._logprobs(model, mine.input_ids.long().to(self.device))
        if self.world_size == 1:
            return lp.cpu()
        rows = torch.tensor_split(torch.arange(batch.num_rows), self.world_size)
        width = max(len(r) for r in rows)
        padded = lp.new_zeros(width, lp.shape[1])
        padded[: lp.shape[0]] = lp
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(parts, padded, group=self.group)
        return torch.cat([p[: len(r)] for p, r in zip(parts, rows)]).cpu()

    def forward_backward(self, batch: TrainBatch, num_tokens: int | None = None
                         ) -> dict[str, float]:
        """GRPO loss on this rank's rows, backward into (accumulating) gradients.

        Args:
            batch: the whole batch (every rank gets it; each trains on its rows).
            num_tokens: the loss denominator; defaults to the batch's response tokens.
                Pass the total over all micro-batches when accumulating.

        Returns:
            metrics summed over ranks (so equal on every rank), named trainer/fb/*.
        """
        model = self._require_model("forward_backward")
        batch.check(self.shape.vocab_size, self.model_config.layers[0].attention.rope.max_seq_len)
        denom = batch.num_response_tokens if num_tokens is None else num_tokens
        if denom <= 0:
            raise ValueError("TrainBatch.response_mask selects no token; nothing to train on")
        t0 = time.perf_counter()
        mine = self._my_rows(batch).to(self.device)
        model.train()
        saved: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            s = t.untyped_storage()
            saved[s.data_ptr()] = s.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            lp = self._logprobs(model, mine.input_ids.long())
        self._activation_bytes = sum(saved.values())
        old = lp.detach() if mine.old_logprobs is None else mine.old_logprobs.float()
        loss, metrics = self.loss_fn(lp, old, mine.advantages.float(),
                                     mine.response_mask, num_tokens=denom)
        loss.backward()
        stats = torch.stack([metrics[k] for k in sorted(metrics)]).detach()
        if self.world_size > 1:
            dist.all_reduce(stats, group=self.group)
        out = {f"trainer/fb/{k}": float(v) for k, v in zip(sorted(metrics), stats)}
        if batch.policy_version is not None:
            out["trainer/fb/staleness_max"] = float(self.version - batch.policy_version.min())
        out["trainer/fb/tokens"] = float(denom)
        out["trainer/fb/seconds"] = time.perf_counter() - t0
        return out

    def optim_step(self) -> dict[str, float]:
        """Clips the global gradient norm, steps AdamW, clears grads, bumps the version."""
        model = self._require_model("optim_step")
        assert self.optimizer is not None
        t0 = time.perf_counter()
        params = [p for p in model.parameters() if p.grad is not None]
        if not params:
            raise StateError("Trainer.optim_step: no gradients; call forward_backward first")
        max_norm = self.config.optimizer.max_grad_norm
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else
                                              float("inf"))
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.version += 1
        return {"trainer/optim/grad_norm": float(norm), "trainer/optim/version": self.version,
                "trainer/optim/seconds": time.perf_counter() - t0}


def _resolve_device(name: str) -> torch.device:
    """``Trainer.Config.device`` -> this process's device (a slot sees one GPU)."""
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("Trainer.Config.device is 'cuda' but torch sees no GPU "
                              f"(torch {torch.__version__}); use device='cpu' or a CUDA "
                              f"build on a GPU host")
        return torch.device("cuda", torch.cuda.current_device())
    raise ConfigError(f"Trainer.Config.device must be 'cpu' or 'cuda', got {name!r}")

