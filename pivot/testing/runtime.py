"""Runtime helpers for tests (see ``pivot.testing``): a service actor per host of a
multi-host allocation, and torch-state role contexts with the slot's role calls, for
meshes of ``SlotActor`` without vLLM or torchtitan.

No driver runs a per-host service yet (the cluster driver's GPS is one actor on this host,
``pivot.runtime.provision.spawn_host_service``). ``SlotInferenceContext`` and
``SlotTrainingContext`` are the ``pivot.testing.shifting`` contexts with the calls the
slot's role endpoints make (``EngineCalls``, ``TrainerCalls``), so a test reaches them
through ``MeshController.engine`` and ``MeshController.trainer`` as the driver reaches the
product's contexts.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from pivot.roles.engine.requests import GenRequest, SeqResult
from pivot.rl.batch import TrainBatch
from pivot.runtime.provision import Allocation
from pivot.testing.fleet import FakeEngine
from pivot.testing.shifting import InferenceContext, TrainingContext


def spawn_per_host(alloc: Allocation, name: str, cls, args: Callable[[int], tuple]) -> list:
    """Spawns one service actor per host of ``alloc`` (e.g. a ``GPSActor``), each on a proc
    of its own on that host; ``args(host)`` gives its constructor arguments."""
    out = []
    for h in range(max(alloc.device_host) + 1):
        host = alloc.hosts if alloc.job is None else alloc.hosts.slice(hosts=h)
        procs = host.spawn_procs(per_host={"procs": 1}, name=f"pivot_{name}{h}")
        out.append(procs.spawn(f"{name}{h}", cls, *args(h)))
    return out


@dataclass
class SlotInferenceContext(InferenceContext):
    """``InferenceContext`` with a slot engine's calls
    (``pivot.roles.engine.slot_context.EngineCalls``) over a ``FakeEngine``: requests are
    held, aborted with their tokens, and never advance (no engine steps them)."""

    engine: FakeEngine = field(default_factory=FakeEngine)

    def submit(self, reqs: list[GenRequest]) -> list[str | None]:
        return self.engine.submit(reqs)

    def abort(self, seq_ids: list[int]) -> dict[int, SeqResult]:
        return self.engine.abort(seq_ids)

    def collect(self) -> dict[int, SeqResult]:
        return self.engine.collect()

    def poll(self) -> tuple[dict[int, SeqResult], dict[int, int]]:
        return self.engine.poll()

    def first_tokens(self, seq_ids: list[int], timeout_s: float = 60.0) -> float:
        return self.engine.first_tokens(seq_ids, timeout_s)

    def refresh(self) -> dict[str, float]:
        return self.engine.refresh()

    def stats(self) -> dict[str, Any]:
        return self.engine.stats()


def seed_batch(seed: int, rows: int = 8, length: int = 8, vocab: int = 1000) -> TrainBatch:
    """A ``TrainBatch`` of random tokens under torch seed ``seed`` (prompt, then response)."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(rows, length)
    mask[:, length // 2:] = 1
    return TrainBatch(torch.randint(0, vocab, (rows, length), generator=g), mask,
                      torch.randn(rows, generator=g))


@dataclass
class SlotTrainingContext(TrainingContext):
    """``TrainingContext`` with a slot trainer's calls
    (``pivot.roles.trainer_context.TrainerCalls``). Its ``train_step`` takes a
    ``TrainBatch`` (``seed_batch``): one ``TrainingContext`` AdamW step on the random
    regression batch seeded by the batch's tokens, as many rows; the AdamW state calls act
    on the module's optimizer. Nothing is collective: each slot of a replica steps alone."""

    version: int = field(default=0, init=False)
    """The policy version after the last step (``train_step``'s ``version`` + 1)."""
    optimizer_tag: tuple | None = field(default=None, init=False)

    def train_step(self, batch: TrainBatch, version: int | None = None  # type: ignore[override]
                   ) -> dict[str, float]:
        if version is not None:
            self.version = version
        loss = super().train_step(int(batch.input_ids.sum()), batch.num_rows)
        self.version += 1
        return {"loss": loss, "version": float(self.version)}

    def reset_optimizer(self, tag: tuple | None = None) -> None:
        self.optimizer.state.clear()
        self.optimizer_tag = tag

    def optimizer_state(self) -> dict:
        return copy.deepcopy(self.optimizer.state_dict())

    def held_optimizer_tag(self) -> tuple | None:
        return self.optimizer_tag

    def set_optimizer_state(self, state: dict, tag: tuple | None = None) -> None:
        self.optimizer.load_state_dict(state)
        self.optimizer_tag = tag
