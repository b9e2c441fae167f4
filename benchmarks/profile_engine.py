"""Profiles one real generator engine and fits the throughput model (sec. 6.1, app. A).

    python benchmarks/profile_engine.py --model DIR --out results/profile_tiny.json

Drives an in-process vLLM CPU engine over a grid of running sequences (N_seq) and context
lengths, times decode steps, fits A, B, C, D with ``fit_throughput_model`` and writes a
profile that ``ThroughputModel.load`` reads. Without ``--model`` it profiles a random tiny
Qwen3 (the built models' shape).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import statistics
import sys
import time
from dataclasses import asdict

from pivot.paths import REPO_ROOT

ROOT = str(REPO_ROOT)
log = logging.getLogger("profile_engine")


def profile(engine, seqs: list[int], lengths: list[int], steps: int, rng: random.Random,
            capped: bool = False):
    from pivot.roles.engine.requests import GenRequest, SampleSpec
    from pivot.scheduler.throughput import LatencySample

    vocab = 300
    samples, sid = [], 0
    for n in seqs:
        for length in lengths:
            ids = list(range(sid, sid + n))
            sid += n
            spec = SampleSpec(max_tokens=steps + 256, ignore_eos=True, logprobs=False)
            for s in ids:
                engine.submit(GenRequest(s, [1] + [rng.randrange(3, vocab) for _ in
                                                   range(length - 1)], spec))
            while any(not engine.live[s].tokens for s in ids):  # prefill (chunked)
                engine.step()
            engine.step()  # the last prefill chunks may share the first decode step
            lat, toks = [], []
            for _ in range(steps):
                toks.append(sum(len(engine.live[s].req.prompt) + len(engine.live[s].tokens)
                                for s in ids))
                engine.step()
                lat.append(engine.last_step_s)
            engine.abort(ids)
            # Uncapped: other jobs on a shared machine only add time, so the fastest step
            # (min) is the engine's own latency. Under a CPU quota the throttled waits are
            # part of a slot's real step time, so the mean is what sets its throughput.
            est = statistics.fmean(lat) if capped else min(lat)
            samples.append(LatencySample(n, int(statistics.median(toks)), est))
            log.info("N_seq=%3d context=%4d: min %.2f ms/step (median %.2f)", n, length,
                     1e3 * min(lat), 1e3 * statistics.median(lat))
    return samples


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="model folder (default: a random tiny Qwen3)")
    p.add_argument("--out", default="results/profile_tiny.json")
    p.add_argument("--seqs", default="1,2,4,8,16,32,64")
    p.add_argument("--lengths", default="16,96,224")
    p.add_argument("--steps", type=int, default=12, help="timed decode steps per grid point")
    p.add_argument("--core", type=int, default=0)
    p.add_argument("--cpu_share", type=float, default=0.0,
                   help="cap this process like a local device slot (cgroup v1 quota, "
                        "fraction of one core; gin CpuConfig.share); 0: no cap")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from pivot.roles.engine.config import EngineConfig
    from pivot.roles.engine.tiny import make_tiny_qwen3
    from pivot.roles.engine.vllm_engine import VllmEngine
    from pivot.scheduler.throughput import ThroughputModel, fit_throughput_model

    t0 = time.perf_counter()
    model = a.model or str(make_tiny_qwen3(os.path.join(ROOT, "cache", "engine_tiny")))
    seqs = [int(x) for x in a.seqs.split(",")]
    lengths = [int(x) for x in a.lengths.split(",")]
    need = max(seqs) * (max(lengths) + a.steps + 260)
    cfg = EngineConfig(model, cache_dir=os.path.join(ROOT, "cache"), cpu_core=a.core,
                       max_num_seqs=max(seqs), num_blocks=max(1024, need // 32 + 64))
    engine = VllmEngine(cfg)
    shares = None
    if a.cpu_share > 0:
        from pivot.cluster.cpu.cgroups import SlotCpuShares
        shares = SlotCpuShares(a.cpu_share, name=f"pivot{os.getpid()}")
        if not shares.assign(a.core, os.getpid()):
            p.error("--cpu_share: no writable cgroup v1 cpu controller on this machine")
    # warm-up: the first steps of a fresh engine are slow
    profile(engine, [max(seqs)], [min(lengths)], 3, random.Random(1))
    samples = profile(engine, seqs, lengths, a.steps, random.Random(0), capped=shares is not None)
    if shares is not None:
        shares.close()
    fit, report = fit_throughput_model(samples)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    fit.save(a.out, fit=asdict(report), model_dir=model, engine=asdict(cfg),
             engine_start_s=engine.start_s, profile_s=time.perf_counter() - t0,
             load_average=os.getloadavg(), cpu_share=a.cpu_share or None,
             estimator=("mean" if shares else "min") + " step latency per grid point",
             samples=[asdict(s) for s in samples])
    engine.shutdown()
    ThroughputModel.load(a.out)  # the scheduler can read it
    print(json.dumps({"A": fit.A, "B": fit.B, "C": fit.C, "D": fit.D, **asdict(report),
                      "seconds": round(time.perf_counter() - t0, 1)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
