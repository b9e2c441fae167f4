"""Benchmarks the 4-slot generator layout: start-up, tokens/s per slot, resident memory,
weight load and release.

    python benchmarks/engine.py [--model DIR] [--slots 4] [--out results/engine_bench.json]

Spawns one Monarch proc and one in-process vLLM engine per slot (``spawn_generators``),
then measures on the real actors. Resident memory is the sum of RSS over this process
and all its descendants (the slot procs), from /proc.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import asdict

from pivot.paths import REPO_ROOT

ROOT = str(REPO_ROOT)
log = logging.getLogger("bench_engine")


def tokens_per_s(actor, batch: int, new_tokens: int, base: int) -> float:
    from pivot.roles.engine.requests import GenRequest, SampleSpec

    spec = SampleSpec(max_tokens=new_tokens, ignore_eos=True, logprobs=True)
    reqs = [GenRequest(base + i, [1, 5 + i % 50, 7, 9], spec) for i in range(batch)]
    t = time.perf_counter()
    out = actor.generate.call_one(reqs).get()
    dt = time.perf_counter() - t
    return sum(len(r.tokens) for r in out.values()) / dt


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="model folder (default: a random tiny Qwen3)")
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--batches", default="1,8,32,64")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--out", default="results/engine_bench.json")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from pivot.roles.engine.config import EngineConfig
    from pivot.roles.engine.memory import tree_rss
    from pivot.roles.engine.tiny import make_tiny_qwen3
    from pivot.testing.engine import random_state_dict
    from pivot.testing.generator import spawn_generators

    model = a.model or str(make_tiny_qwen3(os.path.join(ROOT, "cache", "engine_tiny")))
    cfg = EngineConfig(model, cache_dir=os.path.join(ROOT, "cache"))
    res: dict = {"model": model, "engine": asdict(cfg), "slots": a.slots,
                 "load_average_start": os.getloadavg(), "cpu_binding": "slot i -> core i % 2"}
    t = time.perf_counter()
    actors, procs, failures = spawn_generators(a.slots, cfg)
    res["spawn_and_start_all_s"] = time.perf_counter() - t
    infos = [act.setup.call_one().get() for act in actors.values()]  # already set up: cached
    res["engine_start_s"] = [i["start_s"] for i in infos]
    total, per = tree_rss(os.getpid())
    res["rss_total_bytes"] = total
    res["rss_per_pid_bytes"] = {str(k): v for k, v in per.items() if v > 50 * 2**20}
    slot0 = actors["slot-0"]
    res["tokens_per_s_slot0_alone"] = {}
    for i, b in enumerate(int(x) for x in a.batches.split(",")):
        tokens_per_s(slot0, b, 8, 10_000 * (i + 1))  # warm-up for this batch shape
        res["tokens_per_s_slot0_alone"][b] = tokens_per_s(slot0, b, a.new_tokens,
                                                          100_000 * (i + 1))
        log.info("slot-0 batch %d: %.0f tok/s", b, res["tokens_per_s_slot0_alone"][b])
    # all slots at once, batch 32 each
    t = time.perf_counter()
    futs = []
    from pivot.roles.engine.requests import GenRequest, SampleSpec
    spec = SampleSpec(max_tokens=a.new_tokens, ignore_eos=True)
    for j, act in enumerate(actors.values()):
        futs.append(act.generate.call_one([GenRequest(900_000 + 1000 * j + i, [1, 5, 7 + i % 40],
                                                      spec) for i in range(32)]))
    n = sum(len(r.tokens) for f in futs for r in f.get().values())
    res["tokens_per_s_all_slots_batch32_total"] = n / (time.perf_counter() - t)
    total, _ = tree_rss(os.getpid())
    res["rss_total_after_decode_bytes"] = total
    sd = random_state_dict(model, 5)
    res["weight_load_s_endpoint"] = []
    res["weight_load_s_engine"] = []
    for act in actors.values():
        t = time.perf_counter()
        res["weight_load_s_engine"].append(act.load_weights.call_one(sd).get())
        res["weight_load_s_endpoint"].append(time.perf_counter() - t)
    rel = [act.release.call_one().get() for act in actors.values()]
    res["release"] = [asdict(r) for r in rel]
    res["rss_total_after_release_bytes"] = tree_rss(os.getpid())[0]
    t = time.perf_counter()
    for act in actors.values():
        act.load_weights.call_one(sd).get()  # shift up: Read + reallocate KV
    res["shift_up_all_s"] = time.perf_counter() - t
    res["load_average_end"] = os.getloadavg()
    res["failures"] = failures
    for pm in procs:
        pm.stop().get()
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps({k: v for k, v in res.items() if k not in ("engine", "release")},
                     indent=1))
    print("release:", json.dumps(res["release"][0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
