"""One rank of the trainer's sharded checks (tests/roles/test_trainer_precision.py): a
``Trainer`` on a gloo group of ``world`` processes, built on the meta device, filled from
a safetensors checkpoint by rows, one GRPO step. A module-level function so
``torch.multiprocessing`` can start it in fresh processes."""

from __future__ import annotations

from pathlib import Path


def trainer_rank(rank: int, world: int, init_file: str, model_dir: str, precision: str,
                 batch, out_dir: str) -> None:
    """Runs rank ``rank`` and saves to ``out_dir/rank<r>.pt``: ``logprobs`` before the
    step, the step's ``loss`` and ``grad_norm``, ``bytes_read`` of the checkpoint,
    ``param_dtypes`` of its shards and its Write ``pieces`` (HF name, first row, rows)
    after the step."""
    import torch
    import torch.distributed as dist

    from pivot.safetensors_rows import SafetensorsRows
    from pivot.roles.trainer import Trainer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    try:
        tr = Trainer(Trainer.Config(model=model_dir, optimizer=Trainer.Optimizer(lr=1e-3),
                                    precision=precision, meta_init=True, seed=100 + rank))
        tr.setup()
        reader = SafetensorsRows(model_dir)
        loaded = tr.load_hf_rows(reader)
        lp = tr.compute_logprobs(batch)
        fb = tr.forward_backward(batch)
        opt = tr.optim_step()
        pieces = [(s.name, s.start, s.tensor.clone()) for s in tr.hf_shards()]
        torch.save({"logprobs": lp, "loss": fb["trainer/fb/loss"],
                    "grad_norm": opt["trainer/optim/grad_norm"],
                    "bytes_read": reader.bytes_read, "loaded": loaded["trainer/load/bytes"],
                    "param_dtypes": sorted({str(p.dtype) for p in tr.model.parameters()}),
                    "pieces": pieces}, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
