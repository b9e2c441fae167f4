"""What every part of the GPU check shares: where it runs (a CUDA device with pinned host
memory, or the CPU dry run), timing, the peak host-to-device copy the GPS Read is measured
against (sec. 5.1), and how a part that needs a package the machine lacks says so.

Imports torch only (and ``pivot.roles.titan.qwen2_config``, which imports no more): the GPU
machine a check is run on may have nothing else (no vLLM, Monarch, NIXL or torchtitan, and
perhaps no gin-config or numpy).
"""

from __future__ import annotations

import gc
import time
from functools import partial

import torch

from pivot.roles.titan.qwen2_config import QWEN2_5_0_5B, QWEN2_5_1_5B, QWEN2_5_7B

TINY = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 512, "max_position_embeddings": 256, "rope_theta": 1e6,
        "tie_word_embeddings": True, "use_sliding_window": False}
"""The dry run's stand-in for every model (a tiny tied Qwen2)."""

GiB = 1 << 30

OPTIONAL = ("torchtitan", "triton", "transformers", "safetensors", "numpy", "gin")
"""Packages a part may need that the GPU machine may lack (the part is then skipped, with
the reason): torchtitan (its Qwen2 and the product's trainer; triton, which it imports),
transformers (the fallback model; needs numpy), safetensors (the trainer's checkpoint),
numpy and gin-config (the product's GPS client: ``pivot.gps.layout`` computes with numpy,
``pivot.gps.lease`` is gin-configurable)."""


def missing_package(e: BaseException) -> str | None:
    """The package of :data:`OPTIONAL` whose absence raised ``e`` (a ModuleNotFoundError
    naming it, directly or as the cause), or None: any other error is a failure."""
    while e is not None:
        if isinstance(e, ModuleNotFoundError) and e.name:
            top = e.name.split(".")[0]
            return top if top in OPTIONAL else None
        e = e.__cause__
    return None


def why(e: BaseException) -> str:
    """``e`` as one line for the JSON."""
    return f"{type(e).__name__}: {e}".splitlines()[0][:300]


class Setup:
    """Where the check runs: a CUDA device with pinned host memory, or the CPU dry run."""

    def __init__(self, dry_run: bool) -> None:
        self.dry_run = dry_run
        self.device = torch.device("cpu" if dry_run else "cuda")
        self.pinned = not dry_run
        self.models = ({"tiny": TINY} if dry_run else
                       {"Qwen2.5-1.5B": dict(QWEN2_5_1_5B), "Qwen2.5-7B": dict(QWEN2_5_7B)})
        self.step_model = ("tiny", TINY) if dry_run else ("Qwen2.5-0.5B", dict(QWEN2_5_0_5B))
        self.peak_bytes = (8 << 20) if dry_run else GiB
        self.batch = (4, 32, 8) if dry_run else (8, 512, 128)  # rows, length, prompt

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def free_bytes(self) -> int | None:
        """Free device memory (``cudaMemGetInfo``) after returning cached blocks; None on
        the CPU."""
        gc.collect()
        if self.device.type != "cuda":
            return None
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        return int(torch.cuda.mem_get_info()[0])


def timed(setup: Setup, fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        setup.sync()
        t0 = time.perf_counter()
        fn()
        setup.sync()
        out.append(time.perf_counter() - t0)
    return out


def _size(nbytes: float) -> str:
    return f"{nbytes / 1e9:.2f} GB" if abs(nbytes) >= 1e8 else f"{nbytes / 1e6:.2f} MB"


def _gbps(nbytes: int, seconds: list[float]) -> dict[str, float]:
    s = sorted(seconds)
    return {"best_gbps": nbytes / s[0] / 1e9, "median_gbps": nbytes / s[len(s) // 2] / 1e9,
            "seconds": s}


def peak_h2d(setup: Setup, repeats: int) -> dict:
    """One plain copy of ``peak_bytes`` from (pinned) host memory to the device."""
    src = torch.empty(setup.peak_bytes, dtype=torch.uint8, pin_memory=setup.pinned)
    src.fill_(7)
    dst = torch.empty(setup.peak_bytes, dtype=torch.uint8, device=setup.device)
    t = timed(setup, partial(dst.copy_, src, non_blocking=setup.pinned), repeats + 1)[1:]
    ok = bool(torch.equal(dst[-4096:].cpu(), src[-4096:]))
    del src, dst
    return {"bytes": setup.peak_bytes, **_gbps(setup.peak_bytes, t), "copied_right": ok}
