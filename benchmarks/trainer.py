"""Measures the training role on the tiny Qwen3: step, offload/reload and FSDP2 step times.

Prints one line per measurement and writes ``results/trainer_bench.json``. Times are wall
seconds, median (and min, max) over ``--repeats`` after one warm-up; the machine is shared,
so read them as ranges.

    .venv/bin/python benchmarks/trainer.py [--repeats 5] [--rows 8] [--len 128] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from pathlib import Path

import torch

logger = logging.getLogger("bench_trainer")


def tiny_hf(seed: int = 0):
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.Qwen3Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, vocab_size=512, max_position_embeddings=256,
        tie_word_embeddings=False)
    return transformers.Qwen3ForCausalLM(cfg).eval()


def grpo_batch(rows: int, length: int, vocab: int, seed: int = 0):
    from pivot.losses.grpo import group_advantages
    from pivot.rl.batch import TrainBatch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, length), generator=g)
    mask = torch.zeros(rows, length, dtype=torch.long)
    mask[:, length // 4:] = 1
    adv = group_advantages(torch.rand(rows, generator=g), group_size=4)
    return TrainBatch(ids, mask, adv, None, torch.zeros(rows, dtype=torch.long))


def summary(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def bench_single(hf, batch, repeats: int) -> dict:
    from pivot.roles.trainer import Trainer

    tr = Trainer(Trainer.Config(model=hf.config.to_dict(), optimizer=Trainer.Optimizer(lr=1e-4)))
    tr.setup()
    tr.load_hf_state_dict(hf.state_dict())
    steps, fbs, opts, offs, loads = [], [], [], [], []
    tokens = 0
    off_bytes = rel_bytes = 0
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        m = tr.forward_backward(batch)
        t1 = time.perf_counter()
        tr.optim_step()
        t2 = time.perf_counter()
        o = tr.offload()
        r = tr.reload()
        weights = tr.state_dict_hf()
        rb = tr.release_parameters()["trainer/release/bytes"]
        t3 = time.perf_counter()
        tr.load_hf_state_dict(weights)
        t4 = time.perf_counter()
        if i == 0:
            continue  # warm-up
        steps.append(t2 - t0), fbs.append(t1 - t0), opts.append(t2 - t1)
        offs.append((o["trainer/offload/seconds"], r["trainer/reload/seconds"]))
        loads.append(t4 - t3)
        off_bytes, rel_bytes = o["trainer/offload/bytes"], rb
        tokens = int(m["trainer/fb/tokens"])
    return {
        "params": sum(p.numel() for p in hf.parameters()),
        "step_seconds": summary(steps),
        "forward_backward_seconds": summary(fbs),
        "optim_step_seconds": summary(opts),
        "offload_seconds": summary([a for a, _ in offs]),
        "reload_seconds": summary([b for _, b in offs]),
        "offload_bytes": off_bytes,
        "release_bytes": rel_bytes,
        "load_hf_state_dict_seconds": summary(loads),
        "tokens_per_step": tokens,
        "context_items": tr.context_items(),
    }


def bench_fsdp(hf, batch, repeats: int, procs_n: int = 2) -> dict:
    from monarch.actor import this_host
    from monarch.spmd import setup_torch_elastic_env

    from pivot.roles.trainer import Trainer
    from pivot.roles.trainer_actor import TrainerActor

    t0 = time.perf_counter()
    procs = this_host().spawn_procs(per_host={"procs": procs_n})
    setup_torch_elastic_env(procs)
    actors = procs.spawn("trainer", TrainerActor,
                         Trainer.Config(model=hf.config.to_dict(),
                                        optimizer=Trainer.Optimizer(lr=1e-4)))
    actors.setup.call().get()
    actors.load_hf_state_dict.call(hf.state_dict()).get()
    start = time.perf_counter() - t0
    steps, offs, rels = [], [], []
    off_bytes = 0
    for i in range(repeats + 1):
        t1 = time.perf_counter()
        actors.forward_backward.call(batch).get()
        actors.optim_step.call().get()
        t2 = time.perf_counter()
        o = [v for _, v in actors.offload.call().get().items()]
        r = [v for _, v in actors.reload.call().get().items()]
        if i == 0:
            continue
        steps.append(t2 - t1)
        offs.append(max(x["trainer/offload/seconds"] for x in o))
        rels.append(max(x["trainer/reload/seconds"] for x in r))
        off_bytes = [x["trainer/offload/bytes"] for x in o]
    procs.stop().get()
    return {"procs": procs_n, "start_and_setup_seconds": start,
            "step_seconds": summary(steps), "offload_seconds_max_rank": summary(offs),
            "reload_seconds_max_rank": summary(rels), "offload_bytes_per_rank": off_bytes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--len", type=int, default=128)
    ap.add_argument("--out", default="results/trainer_bench.json")
    ap.add_argument("--no-fsdp", action="store_true")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads of this process (2 threads contended on 2 shared cores)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    hf = tiny_hf()
    batch = grpo_batch(args.rows, args.len, hf.config.vocab_size)
    result = {"batch": [args.rows, args.len], "torch_threads": torch.get_num_threads(),
              "single": bench_single(hf, batch, args.repeats)}
    s = result["single"]
    logger.info("single: %d params, step %.3fs (fb %.3fs + optim %.3fs), offload %.4fs / "
                "reload %.4fs for %d B, release %d B, load %.4fs",
                s["params"], s["step_seconds"]["median"],
                s["forward_backward_seconds"]["median"], s["optim_step_seconds"]["median"],
                s["offload_seconds"]["median"], s["reload_seconds"]["median"],
                s["offload_bytes"], s["release_bytes"], s["load_hf_state_dict_seconds"]["median"])
    if not args.no_fsdp:
        f = result["fsdp2"] = bench_fsdp(hf, batch, args.repeats)
        logger.info("fsdp2 x%d: step %.3fs (start+setup %.1fs), offload %.4fs / reload %.4fs "
                    "for %s B per rank", f["procs"], f["step_seconds"]["median"],
                    f["start_and_setup_seconds"], f["offload_seconds_max_rank"]["median"],
                    f["reload_seconds_max_rank"]["median"], f["offload_bytes_per_rank"])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    logger.info("wrote %s", out)


if __name__ == "__main__":
    main()
