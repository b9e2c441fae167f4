"""Benchmark of the Global Parameter Storage (paper sec. 5.1, appendix B).

Prints and writes ``results/gps_bench.json``:

1. Read and Write bandwidth of a Qwen3-shaped fp32 model (~0.67 GB) between a GPS host
   actor (its own Monarch process) and this process (the receiver), against a plain
   single-process memcpy of the same bytes; plus the Monarch endpoint path's bandwidth.
2. Plan computation time for a 72B-like model (80 layers, TP 8, DP 16 = 128 devices on 16
   hosts) under three GPS layouts, the cached-plan lookup time, and each plan's balance
   (the slowest sender's estimated time over the ideal even split).

3. Rebuild of a lost GPS host (``pivot.gps.recovery``), ~100 MB on the rebuilt host: from a
   surviving replica (replicated layout) and from a checkpoint (one group of two hosts: the
   lost shards had no other copy), with and without checksum verification; in-process host
   stores: from a replica the new store pulls from its peer's shared-memory arena (one
   copy, nothing through this process), from a checkpoint this process writes it over shm.

Run: ``.venv/bin/python benchmarks/gps.py`` (about 1-2 minutes, under 5 GB).
``--plan-only`` runs part 2 alone (a few seconds, no actors) and replaces only the
``planning`` section of the JSON, keeping the transfer results of the last full run;
``--rebuild-only`` likewise runs part 3 alone and replaces only the ``rebuild`` section;
``--tp-shards-only`` runs part 4 alone and replaces only ``tp_shards``.

4. A TP rank's Read of its own shard (the ranges vLLM's loaders read,
   ``pivot.roles.engine.shards``) against a full copy, at Qwen2.5-1.5B's shapes in bf16
   (3.1 GB), ranks 0 of TP 2 and TP 4: bytes and time. Run only with ``--tp-shards-only``
   (about 1 minute, under 10 GB): the full run keeps its memory bound.

Plan times are wall clock (``plan_ms``) and this process's CPU time (``plan_cpu_ms``): on a
shared 2-core machine the wall clock mostly measures the other jobs, the CPU time the plan.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import time

import numpy as np
import torch

from pivot.gps.layout import ParallelLayout, plan_storage, qwen3_model
from pivot.gps.plan import Link, Planner
from pivot.gps.transport import MonarchTransport

logger = logging.getLogger("bench_gps")
OUT = os.path.join(os.path.dirname(__file__), "..", "results", "gps_bench.json")


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def summary(times: list[float], nbytes: int | None = None) -> dict:
    d = {"best_s": min(times), "median_s": statistics.median(times), "runs": len(times)}
    if nbytes:
        d["best_GBps"] = nbytes / min(times) / 1e9
        d["median_GBps"] = nbytes / statistics.median(times) / 1e9
    return d


@contextlib.contextmanager
def gps_host(m, devices: int):
    """One GPS host actor (its own Monarch process) holding model ``m`` whole, and this
    process's client for ``devices`` devices on it; both closed on exit."""
    from monarch.actor import this_host

    from pivot.gps.actor import ActorHost, GPSActor
    from pivot.gps.client import GlobalParameterStorage

    storage = plan_storage([m], 1, m.nbytes)
    procs = this_host().spawn_procs(per_host={"gps": 1})
    host = ActorHost(0, procs.spawn("gps", GPSActor, 0, storage, {"policy": m}))
    gps = GlobalParameterStorage([host], {"policy": m}, storage, (0,) * devices)
    try:
        yield host, gps, storage
    finally:
        gps.close()
        host.close()
        procs.stop().get()


def bench_transfers(repeats: int) -> dict:
    from pivot.gps.client import GlobalParameterStorage

    m = qwen3_model("policy", layers=8, hidden=1024, intermediate=3072, heads=16, kv_heads=8,
                    head_dim=64, vocab=32768)
    nbytes = m.nbytes
    res: dict = {"model_bytes": nbytes, "model_tensors": len(m.params)}

    with gps_host(m, 2) as (host, gps, storage):
        full = {p.name: torch.randn(p.shape) for p in m.params}
        res["load_s"] = summary(timed(lambda: gps.load("policy", full), 1))
        lay = ParallelLayout.create(m, dp=1, tp=2)
        lay1 = ParallelLayout.create(m)
        split = dict(lay.split_dims)
        states = {r: {k: (v if split[k] is None else v.chunk(2, split[k])[r]).contiguous()
                      for k, v in full.items()} for r in (0, 1)}
        full = None  # frees the model-sized copy before the rounds
        out = gps.read("policy", (0, 1), lay)  # warm: maps the arena
        out1 = gps.read("policy", (0,), lay1)
        src = torch.randn(nbytes // 4)
        dst = torch.empty_like(src)
        dst.zero_()
        # Interleaved rounds, so the baseline and GPS see the same load from other jobs.
        ops = {
            "memcpy_preallocated": lambda: dst.copy_(src),
            "memcpy_numpy_1thread": lambda: np.copyto(dst.numpy(), src.numpy()),
            "memcpy_fresh": lambda: torch.empty_like(src).copy_(src),
            "read_tp2_into_out": lambda: gps.read("policy", (0, 1), lay, out=out),
            "read_tp1_into_out": lambda: gps.read("policy", (0,), lay1, out=out1),
            "read_tp2_fresh": lambda: gps.read("policy", (0, 1), lay),
            "write_tp2": lambda: gps.write("policy", (0, 1), lay, states),
        }
        times: dict[str, list[float]] = {k: [] for k in ops}
        for _ in range(repeats):
            for k, fn in ops.items():
                times[k] += timed(fn, 1)
        for k, ts in times.items():
            res[k] = summary(ts, nbytes)
        ratio = [r / m_ for r, m_ in zip(times["memcpy_preallocated"],
                                          times["read_tp2_into_out"])]
        res["read_fraction_of_memcpy_per_round"] = ratio
        res["read_fraction_of_memcpy"] = statistics.median(ratio)
        res["read_fraction_of_numpy_memcpy"] = statistics.median(
            [a / b for a, b in zip(times["memcpy_numpy_1thread"], times["read_tp2_into_out"])])
        res["read_fresh_fraction_of_memcpy_fresh"] = statistics.median(
            [a / b for a, b in zip(times["memcpy_fresh"], times["read_tp2_fresh"])])
        res["write_fraction_of_memcpy"] = statistics.median(
            [a / b for a, b in zip(times["memcpy_preallocated"], times["write_tp2"])])
        src = dst = ops = None  # frees the memcpy buffers
        res["write_tp2_verify"] = summary(timed(
            lambda: gps.write("policy", (0, 1), lay, states, verify=True), 2), nbytes)
        res["read_tp2_into_out_verify"] = summary(timed(
            lambda: gps.read("policy", (0, 1), lay, out=out, verify=True), 2), nbytes)
        assert all(torch.equal(out[0][k], states[0][k]) for k in states[0])
        # The Monarch endpoint path (the remote fallback) on the same read.
        slow = GlobalParameterStorage([host], {"policy": m}, storage, (0, 0),
                                      transports={Link.LOCAL: MonarchTransport()})
        res["read_tp2_monarch_path"] = summary(timed(
            lambda: slow.read("policy", (0, 1), lay, out=out), 1), nbytes)
        slow.close()
        # The NIXL path (the default for remote links), here between two local processes.
        from pivot.gps.nixl import NixlTransport
        nx = NixlTransport()
        viaxl = GlobalParameterStorage([host], {"policy": m}, storage, (0, 0),
                                       transports={Link.LOCAL: nx, Link.REMOTE: nx})
        viaxl.read("policy", (0, 1), lay, out=out)
        res["read_tp2_nixl_path"] = summary(timed(
            lambda: viaxl.read("policy", (0, 1), lay, out=out), 3), nbytes)
        res["read_tp1_nixl_path"] = summary(timed(
            lambda: viaxl.read("policy", (0,), lay1, out=out1), 3), nbytes)
        res["write_tp2_nixl_path"] = summary(timed(
            lambda: viaxl.write("policy", (0, 1), lay, states), 2), nbytes)
        viaxl.close()
        # A one-off link profile for LinkProfile.from_profile (this machine).
        res["profile"] = {"local_bw": res["read_tp2_into_out"]["median_GBps"] * 1e9,
                          "remote_bw": res["read_tp2_nixl_path"]["median_GBps"] * 1e9}
    return res


def bench_planning(repeats: int) -> dict:
    m = qwen3_model("policy", layers=80, hidden=8192, intermediate=29568, heads=64,
                    kv_heads=8, head_dim=128, vocab=152064, dtype="bfloat16")
    lay = ParallelLayout.create(m, dp=16, tp=8)
    devices = tuple(range(128))
    device_host = tuple(d // 8 for d in devices)
    res: dict = {"model": "72B-like Qwen3 (bf16)", "tensors": len(m.params),
                 "model_bytes": m.nbytes, "hosts": 16, "devices": 128, "dp": 16, "tp": 8}
    for name, budget in (("sharded_k16", m.nbytes // 15), ("sharded_k4", m.nbytes // 3),
                         ("replicated_k1", m.nbytes * 2)):
        storage = plan_storage([m], 16, budget)
        entry: dict = {"k": storage.k, "groups": storage.groups}
        for op in ("read", "write"):
            times, cpu, plan = [], [], None
            for _ in range(repeats):
                p = Planner({"policy": m}, storage, device_host)
                t, c = time.perf_counter(), time.process_time()
                plan = p._plan(op, "policy", devices, lay)
                times.append(time.perf_counter() - t)
                cpu.append(time.process_time() - c)
            cached = timed(lambda: p._plan(op, "policy", devices, lay), 1000)
            first = p._plan(op, "policy", devices, lay, greedy=False)
            entry[op] = {
                "plan_ms": summary([t * 1e3 for t in times]),
                "plan_cpu_ms": summary([t * 1e3 for t in cpu]),
                "cached_lookup_ms": summary([t * 1e3 for t in cached]),
                "demands": int(plan.cell.size), "slices": len(plan.cells),
                "makespan_s": plan.makespan, "ideal_s": plan.ideal,
                "balance": plan.makespan / plan.ideal,
                "first_holder_makespan_s": first.makespan,
            }
        res[name] = entry
    return res


def bench_rebuild(repeats: int) -> dict:
    from pivot.gps.client import GlobalParameterStorage
    from pivot.gps.recovery import Checkpoint, rebuild_host
    from pivot.gps.storage import HostStore
    from pivot.gps.transport import ShmTransport
    from pivot.testing.gps import LocalHost

    class Dead:
        def __init__(self, index: int) -> None:
            self.index = index

        def __getattr__(self, op: str):
            def call(*a, **k):
                raise RuntimeError("actor is dead")
            return call

    res: dict = {"note": "in-process host stores; from a replica the new store pulls from "
                         "its peer's shm arena (one copy), from a checkpoint the caller "
                         "writes it over shm"}
    for name, layers, hosts, k in (("from_replica", 2, 2, 1), ("from_checkpoint", 4, 2, 2)):
        m = qwen3_model("policy", layers=layers, hidden=1024, intermediate=2048, heads=16,
                        kv_heads=8, head_dim=64, vocab=4096)
        budget = m.nbytes if k == 1 else m.nbytes * 6 // 10
        storage = plan_storage([m], hosts, budget, min_split_bytes=0)
        assert storage.k == k
        models = {"policy": m}
        stores = [HostStore(h, storage, models) for h in range(hosts)]
        shm = ShmTransport()
        gps = GlobalParameterStorage([LocalHost(s) for s in stores], models, storage,
                                     tuple(range(hosts)), transports={Link.LOCAL: shm,
                                                                      Link.REMOTE: shm})
        full = {p.name: torch.randn(p.shape) for p in m.params}
        gps.load("policy", full)
        ck = {"policy": Checkpoint(0, full)} if k > 1 else None
        entry: dict = {"model_bytes": m.nbytes, "hosts": hosts, "k": k}
        for verify in (True, False):
            times = []
            for _ in range(repeats):
                old = gps.hosts[1]
                gps.hosts[1] = Dead(1)
                old.store.close()
                new = HostStore(1, storage, models)
                rep = rebuild_host(gps, 1, LocalHost(new), checkpoints=ck, verify=verify)
                times.append(rep.seconds)
                entry["rebuilt_bytes"] = rep.nbytes
            entry["verify" if verify else "no_verify"] = summary(times, entry["rebuilt_bytes"])
        out = gps.read("policy", (1,), ParallelLayout.create(m), verify=True)
        assert all(torch.equal(out[1][n], t) for n, t in full.items())
        gps.close()
        for h in gps.hosts:
            h.store.close()
        res[name] = entry
    return res


def print_rebuild(rb: dict) -> None:
    for name in ("from_replica", "from_checkpoint"):
        e = rb[name]
        for v in ("verify", "no_verify"):
            print(f"rebuild {name:16s} {v:9s}: {e['rebuilt_bytes'] / 1e6:.0f} MB in "
                  f"{e[v]['median_s']:.3f} s median (best {e[v]['best_s']:.3f} s, "
                  f"{e[v]['median_GBps']:.2f} GB/s)")


def print_planning(pl: dict) -> None:
    for name in ("sharded_k16", "sharded_k4", "replicated_k1"):
        e = pl[name]
        for op in ("read", "write"):
            o = e[op]
            print(f"72B {name:14s} {op:5s}: plan {o['plan_ms']['median_s']:6.1f} ms "
                  f"(best {o['plan_ms']['best_s']:.1f}; CPU {o['plan_cpu_ms']['median_s']:.1f}),"
                  f" cached {o['cached_lookup_ms']['median_s'] * 1e3:.1f} us, "
                  f"{o['demands']} demands, balance {o['balance']:.4f} "
                  f"(first-holder makespan {o['first_holder_makespan_s']:.3f} s vs greedy "
                  f"{o['makespan_s']:.3f} s)")


def bench_tp_shards(repeats: int) -> dict:
    """A TP rank's GPS Read of its own shard (``pivot.roles.engine.shards``) against a full
    copy, at Qwen2.5-1.5B's shapes in bf16 (28 layers, hidden 1536, 12 query / 2 KV heads
    of 128, MLP 8960, a tied vocabulary of 151,936: 3.1 GB; Qwen3 naming, so q/k norms
    stand in for Qwen2's q/k/v biases). Rank 0 of TP 2 and TP 4, fresh tensors each
    Read, as a shift up Reads; the two kinds of Read interleaved round by round."""
    import functools

    from pivot.roles.engine.shards import vllm_tp_split_dim
    from pivot.shifting.params import tensor_bytes

    m = qwen3_model("policy", layers=28, hidden=1536, intermediate=8960, heads=12,
                    kv_heads=2, head_dim=128, vocab=151936, dtype="bfloat16",
                    tie_embeddings=True)
    res: dict = {"model_bytes": m.nbytes, "model_tensors": len(m.params)}
    with gps_host(m, 4) as (_, gps, _):
        gps.load("policy", {p.name: torch.randn(p.shape, dtype=torch.bfloat16)
                            for p in m.params})
        full = ParallelLayout.create(m, dp=1)
        # each Read into fresh tensors (as a shift up does: page faults included) and into
        # preallocated ones (the copy alone)
        reads = {"full_copy": ((0,), full, {})}
        for k in (2, 4):
            lay = ParallelLayout.create(m, tp=k, split_dim=functools.partial(
                vllm_tp_split_dim, tp=k, kv_heads=2))
            reads[f"own_shard_tp{k}"] = (tuple(range(k)), lay, {"only": (0,)})
        ops = {}
        for name, (devs, lay, kw) in reads.items():
            out = gps.read("policy", devs, lay, **kw)   # warm: maps the arena
            res[f"{name}_bytes"] = tensor_bytes(out[0].values())
            ops[name] = functools.partial(gps.read, "policy", devs, lay, **kw)
            ops[f"{name}_into_out"] = functools.partial(gps.read, "policy", devs, lay,
                                                        out=out, **kw)
        times: dict[str, list[float]] = {k: [] for k in ops}
        for _ in range(repeats):
            for name, fn in ops.items():
                times[name] += timed(fn, 1)
        for name, ts in times.items():
            res[name] = summary(ts, res[f"{name.removesuffix('_into_out')}_bytes"])
        for k in (2, 4):
            s = f"own_shard_tp{k}"
            res[f"{s}_bytes_fraction"] = res[f"{s}_bytes"] / m.nbytes
            for suffix in ("", "_into_out"):
                res[f"{s}{suffix}_time_fraction"] = statistics.median(
                    [a / b for a, b in zip(times[s + suffix], times["full_copy" + suffix])])
    return res


def print_tp_shards(ts: dict) -> None:
    print(f"TP rank's Read, Qwen2.5-1.5B shapes in bf16 ({ts['model_bytes'] / 1e9:.2f} GB): "
          f"full copy median {ts['full_copy']['median_s']:.3f} s fresh, "
          f"{ts['full_copy_into_out']['median_s']:.3f} s into preallocated tensors")
    for k in (2, 4):
        s = f"own_shard_tp{k}"
        print(f"  own shard at TP {k}: {ts[f'{s}_bytes'] / 1e9:.2f} GB "
              f"({ts[f'{s}_bytes_fraction']:.2f} of the bytes); median "
              f"{ts[s]['median_s']:.3f} s fresh ({ts[f'{s}_time_fraction']:.2f} of a full "
              f"copy's), {ts[f'{s}_into_out']['median_s']:.3f} s into preallocated "
              f"({ts[f'{s}_into_out_time_fraction']:.2f})")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan-only", action="store_true",
                    help="time plan computation only; rewrite only the 'planning' section")
    ap.add_argument("--rebuild-only", action="store_true",
                    help="time the rebuild of a lost host only; rewrite only 'rebuild'")
    ap.add_argument("--tp-shards-only", action="store_true",
                    help="time a TP rank's own-shard Read against a full copy only; "
                         "rewrite only 'tp_shards'")
    ap.add_argument("--repeats", type=int, default=7, help="plans computed per layout and op")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    t0 = time.time()
    logger.info("load average at start: %s (2 cores; other jobs make timings noisy)",
                os.getloadavg())
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    if args.plan_only or args.rebuild_only or args.tp_shards_only:
        results: dict = {}
        if os.path.exists(OUT):
            with open(OUT) as f:
                results = json.load(f)
        load0 = os.getloadavg()
        section, run, show = (
            ("planning", lambda: bench_planning(repeats=args.repeats), print_planning)
            if args.plan_only else
            ("rebuild", lambda: bench_rebuild(repeats=3), print_rebuild)
            if args.rebuild_only else
            ("tp_shards", lambda: bench_tp_shards(repeats=5), print_tp_shards))
        part = run()
        part["loadavg_at_start"], part["loadavg_at_end"] = load0, os.getloadavg()
        part["wall_s"] = time.time() - t0
        results[section] = part
        with open(OUT, "w") as f:
            json.dump(results, f, indent=2)
        show(part)
        print(f"rewrote the {section} section of {os.path.abspath(OUT)} in "
              f"{part['wall_s']:.0f} s")
        return
    results = {"loadavg_at_start": os.getloadavg(),
               "planning": bench_planning(repeats=args.repeats),
               "rebuild": bench_rebuild(repeats=3),
               "transfers": bench_transfers(repeats=5)}
    results["wall_s"] = time.time() - t0
    results["loadavg_at_end"] = os.getloadavg()
    with open(OUT, "w") as f:
        json.dump(results, f, indent=2)
    tr, pl = results["transfers"], results["planning"]
    print(f"model {tr['model_bytes'] / 1e9:.2f} GB, {tr['model_tensors']} tensors")
    for k in ("memcpy_preallocated", "memcpy_numpy_1thread", "memcpy_fresh", "write_tp2",
              "write_tp2_verify",
              "read_tp2_fresh", "read_tp2_into_out", "read_tp2_into_out_verify",
              "read_tp1_into_out", "read_tp2_monarch_path", "read_tp2_nixl_path",
              "read_tp1_nixl_path", "write_tp2_nixl_path"):
        print(f"  {k:28s} best {tr[k]['best_GBps']:6.2f} GB/s  median "
              f"{tr[k]['median_GBps']:6.2f} GB/s")
    print(f"  median over rounds of read / memcpy (into out): "
          f"{tr['read_fraction_of_memcpy']:.2f} (of 1-thread numpy memcpy: "
          f"{tr['read_fraction_of_numpy_memcpy']:.2f})   "
          f"read / memcpy (fresh): {tr['read_fresh_fraction_of_memcpy_fresh']:.2f}   "
          f"write / memcpy: {tr['write_fraction_of_memcpy']:.2f}")
    print_planning(pl)
    print_rebuild(results["rebuild"])
    print(f"wrote {os.path.abspath(OUT)} in {results['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
