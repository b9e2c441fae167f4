"""One rank of the sharded Qwen2 check (tests/roles/titan/test_qwen2.py): build on the meta
device, shard with FSDP2 over gloo, Read this rank's rows from a safetensors checkpoint,
compute log-probs and hand back this rank's Write pieces. A module-level function so
``torch.multiprocessing`` can start it in fresh processes."""

from __future__ import annotations

from pathlib import Path


def sharded_qwen2_rank(rank: int, world: int, init_file: str, model_dir: str, ids,
                       out_dir: str) -> None:
    """Runs rank ``rank`` of ``world`` and saves its results to ``out_dir/rank<r>.pt``:
    ``logprobs`` [B, L] of ``ids``, ``bytes_read`` from the checkpoint, ``local_bytes`` of
    its parameter shards and ``pieces`` (HF name, first row, rows) of its Write."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from pivot.losses.grpo import token_logprobs
    from pivot.roles.titan.hf_shards import hf_shards, load_hf_shards
    from pivot.safetensors_rows import SafetensorsRows
    from pivot.roles.titan.qwen2 import (Qwen2Shape, build_qwen2, qwen2_model_config,
                                         state_dict_adapter)

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
        config = qwen2_model_config(Qwen2Shape.from_hf(model_dir), max_seq_len=64)
        model = build_qwen2(config, mesh=mesh, seed=100 + rank)  # seeds differ: all loaded
        adapter = state_dict_adapter(config)
        reader = SafetensorsRows(model_dir)
        load_hf_shards(model, adapter, reader)
        with torch.no_grad():
            lp = token_logprobs(model(ids), ids)
        pieces = [(s.name, s.start, s.tensor.clone()) for s in hf_shards(model, adapter)]
        local = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
        torch.save({"logprobs": lp, "bytes_read": reader.bytes_read, "local_bytes": local,
                    "pieces": pieces}, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
