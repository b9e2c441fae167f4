"""Rows of the tensors of a Hugging Face checkpoint folder, read by safetensors slices.

One reader for both sides that load a checkpoint by rows: each GPS host fills only the
rows it stores (``pivot.gps.checkpoint``, sec. 5.1) and each trainer rank only the rows of
its FSDP2 shard (``pivot.roles.titan.hf_shards``). Imports torch and safetensors only, so
the GPU check can use it on a machine without the rest of the stack.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from pivot.errors import ConfigError

if TYPE_CHECKING:
    import torch


def checkpoint_files(folder: str | Path) -> list[Path]:
    """The safetensors files of a HF model folder: those a sharded checkpoint's
    ``model.safetensors.index.json`` names, else ``model.safetensors``."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = json.loads(index.read_text())["weight_map"].values()
        except (ValueError, KeyError, AttributeError) as e:
            raise ConfigError(f"{index}: not a safetensors index with a 'weight_map' "
                              f"({e}); re-save the checkpoint") from None
        return [folder / f for f in sorted(set(names))]
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    raise ConfigError(f"{folder}: no model.safetensors nor model.safetensors.index.json; "
                      f"point at a Hugging Face model folder")


class SafetensorsRows:
    """Rows read by slices from a HF checkpoint folder: only the bytes of the requested
    rows are read, and ``bytes_read`` counts them, so a caller can show it read only its
    own shard."""

    def __init__(self, folder: str | Path) -> None:
        from safetensors import safe_open

        self._file_of = {}
        for f in checkpoint_files(folder):
            h = safe_open(str(f), framework="pt", device="cpu")
            self._file_of.update(dict.fromkeys(h.keys(), h))
        self.bytes_read = 0

    def shape(self, name: str) -> tuple[int, ...]:
        """Raises KeyError for a tensor the folder does not hold."""
        return tuple(self._file_of[name].get_slice(name).get_shape())

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        t = self._file_of[name].get_slice(name)[start:stop]
        self.bytes_read += t.numel() * t.element_size()
        return t
