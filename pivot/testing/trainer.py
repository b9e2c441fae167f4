"""The cluster driver's training context in a slot whose default process group is a world of
one, as in a slot that hosts vLLM engines (vLLM initialises ``torch.distributed`` with its
own world of 1 in the process): the trainer's gloo group must live beside it."""

from __future__ import annotations

import tempfile
from typing import Any


def trainer_beside_world_of_one(model_dir: str, lr: float, max_seq_len: int, seed: int,
                                warmup_rows: int = 8) -> Any:
    """A ``SlotTrainerContext`` built after a gloo default group of world size 1 (what vLLM
    leaves in the slot's process), for slot factories in tests."""
    import torch.distributed as dist

    from pivot.roles.trainer_context import SlotTrainerContext

    if not dist.is_initialized():
        path = tempfile.NamedTemporaryFile(prefix="world1_", delete=False).name
        dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
    return SlotTrainerContext(model_dir, lr, max_seq_len, seed, warmup_rows=warmup_rows,
                              warmup_len=32)
