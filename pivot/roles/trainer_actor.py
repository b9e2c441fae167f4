"""The training proc: a thin Monarch actor around ``pivot.roles.trainer.Trainer``."""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
import torch.distributed as dist
from monarch.actor import Actor, endpoint

from pivot.roles.trainer import Trainer
from pivot.rl.batch import TrainBatch

logger = logging.getLogger(__name__)

__all__ = ["TrainerActor"]


class TrainerActor(Actor):
    """One training proc: a thin Monarch shell around ``Trainer`` (all endpoints sync).

    Spawn on a proc mesh, call ``setup_torch_elastic_env(procs)`` from the controller,
    then ``setup.call()``: it joins the gloo group (when the mesh has more than one proc)
    and builds the FSDP2 model. Every other endpoint is collective: call it on all ranks.
    """

    def __init__(self, config: Trainer.Config) -> None:
        self.trainer = Trainer(config)

    @endpoint
    def setup(self) -> dict[str, Any]:
        import os

        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world > 1 and not dist.is_initialized():
            t0 = time.perf_counter()
            dist.init_process_group("gloo")
            logger.info("rank %d/%d joined gloo in %.2fs", dist.get_rank(), world,
                        time.perf_counter() - t0)
        return self.trainer.setup()

    @endpoint
    def load_hf_state_dict(self, hf_state_dict: dict[str, torch.Tensor]) -> dict[str, Any]:
        return self.trainer.load_hf_state_dict(hf_state_dict)

    @endpoint
    def compute_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        return self.trainer.compute_logprobs(batch)

    @endpoint
    def forward_backward(self, batch: TrainBatch, num_tokens: int | None = None
                         ) -> dict[str, float]:
        return self.trainer.forward_backward(batch, num_tokens)

    @endpoint
    def optim_step(self) -> dict[str, float]:
        return self.trainer.optim_step()

    @endpoint
    def state_dict_hf(self, only_rank0: bool = False) -> dict[str, torch.Tensor]:
        """Full HF tensors on every rank, or only on rank 0 (the others return {})."""
        sd = self.trainer.state_dict_hf()
        return {} if only_rank0 and self.trainer.rank != 0 else sd

    @endpoint
    def offload(self) -> dict[str, Any]:
        return self.trainer.offload()

    @endpoint
    def reload(self) -> dict[str, Any]:
        return self.trainer.reload()

    @endpoint
    def release_parameters(self) -> dict[str, Any]:
        return self.trainer.release_parameters()

    @endpoint
    def context_items(self) -> list[tuple[str, str, int]]:
        return self.trainer.context_items()
