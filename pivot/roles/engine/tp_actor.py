"""A tensor-parallel replica as Monarch procs, one per device: each
proc holds a ``TpRankActor``, ``monarch.spmd.setup_torch_elastic_env`` gives the procs
torchrun's variables, and each actor builds its rank's ``external_launcher`` engine
(``pivot.roles.engine.tp``). Only rank 0 is handed the step decisions; it broadcasts them.

    procs = this_host().spawn_procs(per_host={"procs": 2})
    setup_torch_elastic_env(procs)
    ranks = procs.spawn("tp", TpRankActor, model_dir, 2)
    ranks.setup.call().get()
"""

from __future__ import annotations

import os
import time
from typing import Any

from monarch.actor import Actor, endpoint

from pivot.roles.engine.tp import (LockstepEngine, StepDecision, build_engine, run_script,
                                   set_rank_env)


class TpRankActor(Actor):
    """One rank of a TP replica (all endpoints sync, each on its own proc).

    Args:
        model_dir: the HF model folder every rank loads (its own shard of it).
        tp: the replica's size; the proc mesh must hold ``tp`` procs.
    """

    def __init__(self, model_dir: str, tp: int) -> None:
        self.model_dir, self.tp = model_dir, tp
        self.engine: LockstepEngine | None = None

    @endpoint
    def setup(self) -> dict[str, Any]:
        """Builds this rank's engine; a collective: call it on every rank at once."""
        set_rank_env(int(os.environ.get("LOCAL_RANK", "0")))
        t = time.perf_counter()
        self.engine = LockstepEngine(build_engine(self.model_dir, self.tp))
        return {"rank": int(os.environ.get("RANK", "0")), "pid": os.getpid(),
                "start_s": time.perf_counter() - t}

    @endpoint
    def run(self, script: dict[int, StepDecision] | None) -> dict[str, Any]:
        """Steps the replica until rank 0's script is done (rank 0 gets the script, the
        others None); a collective like ``setup``."""
        rank = int(os.environ.get("RANK", "0"))
        return run_script(self.engine, script if rank == 0 else None, rank)
