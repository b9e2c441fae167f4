"""Part c of ``launchers/gpu_check.py``: the product's own trainer on the device, as the
cluster driver builds it on a GPU (bf16, meta-device build, rows from a checkpoint, a shift
down and up), which no other check runs there.

``pivot.roles.trainer.Trainer`` with ``device`` = the check's device, ``precision='bf16'``
and ``meta_init=True``, on Qwen2.5-0.5B shapes (the dry run: the tiny Qwen2): built on the
meta device, filled by rows from a safetensors checkpoint of random weights written here
(``load_hf_rows``), one GRPO step, then a shift down and up the way the cluster driver does
it (``offload`` + ``release_parameters``, ``reload`` + ``load_hf_rows`` from the same
checkpoint) with the device memory returned measured, and the log-probs before and after
the round trip compared bit for bit (the weights reloaded are the checkpoint's, so the
step's update is undone: the log-probs compared are those of the loaded checkpoint).

Needs torchtitan (``pivot.roles.titan``) and safetensors; where either does not import,
the part is recorded as skipped with the reason, not failed. Not numpy: safetensors'
``save_file`` needs it, so without it the checkpoint is written here, in the same format
(read back by safetensors' own reader).
"""

from __future__ import annotations

import ctypes
import json
import logging
import struct
import tempfile
import time
from pathlib import Path

import torch

logger = logging.getLogger("gpu_check")


_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}


def save_safetensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """The safetensors format without numpy (which ``safetensors.torch.save_file`` imports):
    a little-endian u64 header length, the JSON header (dtype, shape, byte range of each
    tensor) padded with spaces to 8 bytes, then the raw little-endian data in that order."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        n = t.numel() * t.element_size()
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + n]}
        blobs.append((t, n))
        off += n
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for t, n in blobs:
            if n:
                f.write(ctypes.string_at(t.data_ptr(), n))


def _write_checkpoint(folder: Path, config: dict, seed: int) -> int:
    """config.json and one safetensors file of random HF tensors (std 0.02) for every
    tensor the trainer's model asks for; returns the bytes written."""
    from pivot.roles.titan.family import family_of
    from pivot.roles.titan.hf_shards import hf_shapes

    fam = family_of(config)
    mc = fam.model_config(fam.shape(config), 256)
    with torch.device("meta"):
        model = mc.build()
    g = torch.Generator().manual_seed(seed)
    tensors = {k: (0.02 * torch.randn(s, generator=g)).to(torch.bfloat16)
               for k, s in hf_shapes(model, fam.adapter(mc)).items()}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    try:
        from safetensors.torch import save_file

        save_file(tensors, str(folder / "model.safetensors"))
    except ModuleNotFoundError as e:
        if e.name != "numpy":
            raise
        save_safetensors(tensors, folder / "model.safetensors")
    return sum(t.numel() * t.element_size() for t in tensors.values())


def trainer_check(setup, batch_fn) -> dict:
    """Runs part c; ``batch_fn(setup, vocab, seed)`` is gpu_check's ``grpo_batch``."""
    try:
        import pivot.roles.titan.qwen2  # noqa: F401  (torchtitan, imported by the build)
        from pivot.safetensors_rows import SafetensorsRows
        import safetensors  # noqa: F401  (the checkpoint's reader)

        from pivot.rl.batch import TrainBatch
        from pivot.roles.trainer import Trainer
    except ImportError as e:
        return {"skipped": f"pivot.roles.trainer does not import here: {e}"}
    name, config = setup.step_model
    config = {**config, "model_type": "qwen2", "torch_dtype": "bfloat16"}
    res: dict = {"model": name, "device": str(setup.device), "precision": "bf16",
                 "meta_init": True}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "ckpt"
        res["checkpoint_bytes"] = _write_checkpoint(folder, config, seed=0)
        tr = Trainer(Trainer.Config(model=str(folder), max_seq_len=setup.batch[1],
                                    optimizer=Trainer.Optimizer(lr=1e-5),
                                    device=setup.device.type, precision="bf16",
                                    meta_init=True))
        free0 = setup.free_bytes()
        t = time.perf_counter()
        tr.setup()
        res["setup_s"] = time.perf_counter() - t
        reader = SafetensorsRows(folder)
        res["load"] = tr.load_hf_rows(reader)
        res["bytes_read"] = reader.bytes_read
        ids, mask, adv, _ = (x.cpu() for x in batch_fn(setup, tr.shape.vocab_size, 1))
        batch = TrainBatch(ids, mask, adv)
        lp0 = tr.compute_logprobs(batch)
        setup.sync()
        t = time.perf_counter()
        fb = tr.forward_backward(batch)
        opt = tr.optim_step()
        setup.sync()
        res["step_s"] = time.perf_counter() - t
        res["loss"], res["grad_norm"] = fb["trainer/fb/loss"], opt["trainer/optim/grad_norm"]
        res["param_dtypes"] = sorted({str(p.dtype) for p in tr.model.parameters()})
        lp1 = tr.compute_logprobs(batch)
        res["step_changed_logprobs"] = not torch.equal(lp0, lp1)
        held = setup.free_bytes()
        t = time.perf_counter()
        off = tr.offload()
        rel = tr.release_parameters()
        setup.sync()
        res["shift_down_s"] = time.perf_counter() - t
        after = setup.free_bytes()
        res["offloaded_bytes"] = off["trainer/offload/bytes"]
        res["released_bytes"] = rel["trainer/release/bytes"]
        if held is not None and after is not None:
            res["device_bytes_returned"] = after - held
            res["returned_over_moved"] = (after - held) / max(
                1, res["offloaded_bytes"] + res["released_bytes"])
            res["device_bytes_before_setup"] = free0
        t = time.perf_counter()
        tr.reload()
        tr.load_hf_rows(SafetensorsRows(folder))
        setup.sync()
        res["shift_up_s"] = time.perf_counter() - t
        res["logprobs_equal_after_round_trip"] = torch.equal(tr.compute_logprobs(batch), lp0)
        fb2 = tr.forward_backward(batch)
        res["loss_after_round_trip"] = fb2["trainer/fb/loss"]
        res["loss_equal_after_round_trip"] = fb2["trainer/fb/loss"] == res["loss"]
    logger.info("trainer (pivot.roles.trainer, %s, bf16, meta init): setup %.2f s, step "
                "%.2f s, loss %.6f; shift down %.2f s, up %.2f s; round trip exact %s",
                name, res["setup_s"], res["step_s"], res["loss"], res["shift_down_s"],
                res["shift_up_s"], res["logprobs_equal_after_round_trip"])
    return res


def trainer_checks(res: dict) -> dict[str, bool]:
    """The part's pass/fail lines for gpu_check's ``checks`` (none when skipped)."""
    if "skipped" in res:
        return {}
    if "error" in res:
        return {"trainer_ran": False}
    out = {"trainer_ran": True,
           "trainer_master_weights_fp32": res["param_dtypes"] == ["torch.float32"],
           "trainer_step_changed_logprobs": res["step_changed_logprobs"],
           "trainer_round_trip_logprobs_exact": res["logprobs_equal_after_round_trip"],
           "trainer_round_trip_loss_exact": res["loss_equal_after_round_trip"],
           "trainer_read_only_checkpoint_bytes": res["bytes_read"] == res["checkpoint_bytes"]}
    if "returned_over_moved" in res:
        out["trainer_device_memory_returned_>=90%"] = res["returned_over_moved"] >= 0.9
    return out
