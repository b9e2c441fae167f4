"""Engine configuration and the process settings vLLM's CPU build needs (STACK.md).

Layout choice (issue "Real role engines", item 2): one in-process vLLM engine per device
slot. Policy and GenRM share one Qwen3 architecture and tokenizer
(``pivot.models.config``), so the slot's one engine serves either model; a role shift
between rollout and reward swaps weights through ``reload_weights`` and never restarts
the engine (sec. 5.2 keeps the engine definition as preserved context). The engine runs
inside the slot's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), which halves its memory,
and the KV cache is sized by a block count, not the whole-GiB ``VLLM_CPU_KVCACHE_SPACE``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from pivot.errors import ConfigError


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """One generator engine.

    Attributes:
        model: a Hugging Face model folder (config.json, safetensors, tokenizer).
        max_model_len: longest prompt + generation, tokens.
        block_size: KV block in tokens; small so resumed prompts hit the prefix cache
            (the CPU attention backend needs a multiple of 32).
        num_blocks: KV blocks; capacity is ``num_blocks * block_size`` tokens.
        max_num_seqs: the engine's batch cap (the scheduler dispatches below it).
        cpu_core: the core this slot's OpenMP threads bind to (``None``: vLLM's default).
        enforce_eager: skip torch.compile (start in seconds instead of a minute).
        seed: engine seed.
        cache_dir: where vLLM, inductor and temporary files go.
    """

    model: str
    max_model_len: int = 512
    block_size: int = 32
    num_blocks: int = 1024
    max_num_seqs: int = 64
    cpu_core: int | None = 0
    enforce_eager: bool = True
    seed: int = 0
    cache_dir: str = "cache"

    @property
    def kv_capacity(self) -> int:
        """KV cache capacity in tokens (what the scheduler's ``ReplicaView`` holds)."""
        return self.num_blocks * self.block_size


def check_model_dir(path: str | Path) -> Path:
    """Raises ConfigError unless ``path`` is a loadable model folder; returns it resolved."""
    p = Path(path)
    if not p.is_dir():
        raise ConfigError(f"model folder {p} does not exist; build the models "
                          f"(launchers/build_models.py) or fix the path")
    cfg = p / "config.json"
    try:
        data = json.loads(cfg.read_text())
    except FileNotFoundError:
        raise ConfigError(f"model folder {p} has no config.json; it is not a saved "
                          f"Hugging Face model") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"model folder {p}: config.json is malformed ({e})") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise ConfigError(f"model folder {p}: config.json names no model_type")
    if not any(p.glob("*.safetensors")):
        raise ConfigError(f"model folder {p} has no *.safetensors weights")
    if not (p / "tokenizer.json").is_file() and not (p / "tokenizer_config.json").is_file():
        raise ConfigError(f"model folder {p} has no tokenizer files")
    return p.resolve()


def configure_process(cfg: EngineConfig) -> None:
    """Sets the environment vLLM reads at engine start; call before building the engine.

    In-process engine, offline hub, the KV reservation floor at 1 GiB (the block count
    then sizes the real cache), caches under ``cfg.cache_dir``, and the slot's core.
    """
    root = Path(cfg.cache_dir).resolve()
    for sub in ("vllm", "inductor", "tmp"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["VLLM_CACHE_ROOT"] = str(root / "vllm")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(root / "inductor")
    os.environ["TMPDIR"] = str(root / "tmp")
    if cfg.cpu_core is not None:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(cfg.cpu_core)
