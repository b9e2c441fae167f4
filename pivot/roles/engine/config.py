"""Engine configuration and the process settings vLLM's CPU build needs (docs/stack.md).

Layout choice: one in-process vLLM engine per device
slot. Policy and GenRM share one Qwen3 architecture and tokenizer
(``pivot.models.config``), so the slot's one engine serves either model; a role shift
between rollout and reward swaps weights through ``reload_weights`` and never restarts
the engine (sec. 5.2 keeps the engine definition as preserved context). The engine runs
inside the slot's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), which halves its memory,
and the KV cache is sized by a block count, not the whole-GiB ``VLLM_CPU_KVCACHE_SPACE``
(both knobs are set in ``pivot.compat.vllm``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
        dtype: compute dtype (``float32`` on this AVX2 CPU, where bf16 has no oneDNN
            kernel, docs/stack.md; ``Backend.dtype`` gives ``bfloat16`` on GPUs).
        load_format: vLLM's ``load_format``; ``dummy`` starts the engine on random weights
            of the real shapes (the first shift up Reads the real ones from GPS).
        tensor_parallel_size: devices of one replica; above 1 each device's process
            builds its rank's engine with vLLM's ``external_launcher`` (torchrun's
            variables set, ``pivot.roles.engine.tp.torchrun_env``) and rank 0 mirrors
            every engine call to the others (``pivot.roles.engine.mirror``).
        expert_parallel: an MoE model's replica divides its experts among its
            ``tensor_parallel_size`` ranks (vLLM's ``enable_expert_parallel``, as the
            paper's MoE GenRMs are served) instead of slicing every expert.
        gpu_memory_utilization: vLLM's share of the GPU for this engine (None: vLLM's
            default; the ``cpu`` engines leave it None, their KV cache is ``num_blocks``).
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
    dtype: str = "float32"
    load_format: str = "auto"
    tensor_parallel_size: int = 1
    expert_parallel: bool = False
    gpu_memory_utilization: float | None = None

    @property
    def kv_capacity(self) -> int:
        """KV cache capacity in tokens (what the scheduler's ``ReplicaView`` holds)."""
        return self.num_blocks * self.block_size


_REBUILD = ("rebuild the models (python launchers/build_models.py) or re-download the "
            "model")
_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "I16": 2,
                "F16": 2, "BF16": 2, "U32": 4, "I32": 4, "F32": 4, "U64": 8, "I64": 8,
                "F64": 8}
_MAX_HEADER = 100 * 1024 * 1024
"""The safetensors format's own bound on the JSON header (100 MiB)."""


def read_hf_weights(path: str | Path) -> dict[str, Any]:
    """Every tensor of a Hugging Face model folder's ``*.safetensors`` files, by HF name,
    in the files' dtypes (``check_model_dir`` checks the files first where it matters)."""
    from safetensors.torch import load_file

    state: dict[str, Any] = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        state.update(load_file(str(f)))
    return state


def read_hf_config(path: str | Path) -> tuple[dict[str, Any], Path]:
    """Reads a Hugging Face ``config.json``: the one reader of it in PivotRL.

    Args:
        path: a model folder holding ``config.json``, or the file itself.

    Returns:
        ``(config dict, the file read)``.

    Raises:
        ConfigError: the file is missing, is not JSON (e.g. truncated by an interrupted
            copy), or its top level is not an object; the message names the file and the fix.
    """
    p = Path(path)
    f = p / "config.json" if p.is_dir() else p
    if not f.is_file():
        raise ConfigError(f"{f} does not exist; pass a saved Hugging Face model folder "
                          f"holding config.json (or the file itself); if the model should be "
                          f"there, {_REBUILD}")
    try:
        data = json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{f} is malformed ({type(e).__name__}: {e}); the file is "
                          f"truncated or corrupt: {_REBUILD}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{f} is malformed: its top level is a {type(data).__name__}, "
                          f"not a JSON object; {_REBUILD}")
    return data, f


def check_safetensors(path: str | Path) -> None:
    """Raises ConfigError unless ``path`` is a whole safetensors file.

    Cheap (reads the header only): an 8-byte little-endian header length, a JSON object
    header, and tensors whose ``data_offsets`` lie in the data section, match their dtype
    and shape, and end exactly at the end of the file (so a truncated copy is caught).
    """
    f = Path(path)
    size = f.stat().st_size

    def bad(why: str) -> ConfigError:
        return ConfigError(f"weights file {f} is not a valid safetensors file ({why}); it is "
                           f"truncated or corrupt: {_REBUILD}")

    if size < 8:
        raise bad(f"{size} bytes, shorter than the 8-byte header length")
    with f.open("rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        if n < 2 or n > _MAX_HEADER or 8 + n > size:
            raise bad(f"header length {n} does not fit a {size}-byte file")
        raw = fh.read(n)
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad(f"the JSON header does not parse: {e}") from None
    if not isinstance(header, dict):
        raise bad("the JSON header is not an object")
    data_bytes, end = size - 8 - n, 0
    for name, t in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, stop = (int(x) for x in t["data_offsets"])
            shape = [int(x) for x in t["shape"]]
            dtype = str(t["dtype"])
        except (KeyError, TypeError, ValueError):
            raise bad(f"tensor {name!r} has no valid dtype/shape/data_offsets") from None
        if not 0 <= begin <= stop <= data_bytes:
            raise bad(f"tensor {name!r} spans bytes [{begin}, {stop}) of a {data_bytes}-byte "
                      f"data section")
        if dtype in _DTYPE_BYTES:
            want = _DTYPE_BYTES[dtype] * math.prod(shape)
            if stop - begin != want:
                raise bad(f"tensor {name!r} ({dtype} {shape}) needs {want} bytes, its "
                          f"offsets give {stop - begin}")
        end = max(end, stop)
    if end != data_bytes:
        raise bad(f"the tensors end at byte {end} of a {data_bytes}-byte data section")


def check_model_dir(path: str | Path) -> Path:
    """Raises ConfigError unless ``path`` is a loadable model folder; returns it resolved.

    Checks (before an engine spends 45-80 s starting): ``config.json`` parses and names a
    ``model_type``, every ``*.safetensors`` file is whole (header and sizes, see
    ``check_safetensors``), and tokenizer files are present.
    """
    p = Path(path)
    if not p.is_dir():
        raise ConfigError(f"model folder {p} does not exist; build the models "
                          f"(launchers/build_models.py) or fix the path")
    data, cfg = read_hf_config(p)
    if "model_type" not in data:
        raise ConfigError(f"model folder {p}: {cfg.name} names no model_type")
    weights = sorted(p.glob("*.safetensors"))
    if not weights:
        raise ConfigError(f"model folder {p} has no *.safetensors weights")
    for w in weights:
        check_safetensors(w)
    if not (p / "tokenizer.json").is_file() and not (p / "tokenizer_config.json").is_file():
        raise ConfigError(f"model folder {p} has no tokenizer files")
    return p.resolve()


def configure_process(cfg: EngineConfig) -> None:
    """Sets the environment vLLM reads at engine start; call before building the engine.

    In-process engine, offline hub, the KV reservation floor at 1 GiB (the block count
    then sizes the real cache), caches under ``cfg.cache_dir``, and the slot's core: the
    knobs are vLLM's, set by ``pivot.compat.vllm.set_process_env``.
    """
    from pivot.compat.vllm import set_process_env

    root = Path(cfg.cache_dir).resolve()
    for sub in ("vllm", "inductor", "tmp"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    set_process_env(root, cfg.cpu_core)
