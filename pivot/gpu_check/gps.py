"""Part d of ``launchers/gpu_check.py``: the product's GPS path between a host arena and a
GPU (paper sec. 5.1, appendix B.2).

Where part a copies from a buffer it allocated pinned, this part runs the product's own
client (``pivot.gps.client.GlobalParameterStorage`` over an in-process ``HostStore``,
whose arenas are ``/dev/shm`` files) and its host-local transport (``ShmTransport``),
which registers each mapped arena with the CUDA driver once (``pivot.gps.pinned``) and
copies slices as asynchronous DMAs. At Qwen2.5-1.5B and 7B shapes (bf16, dummy values
drawn on the device), it measures:

- the first Write from device parameters into GPS (the staged arena registered then) and
  later Writes;
- the first Read into preallocated device parameters (its arena registered then) and
  later Reads, as GB/s and against a plain pinned copy's peak measured here;
- the bytes registered (once per mapping: a host recycles one arena, so two in a run);
- every parameter bit-exact after a Read (redrawn from its seed on the device).

Imports no vLLM, Monarch or NIXL. The client needs numpy (``pivot.gps.layout``) and
gin-config (``pivot.gps.lease``, through ``pivot.gps.storage``): where either is missing
the part is skipped with the reason. A model whose arenas do not fit the shared-memory
folder's free space is skipped with the reason. The dry run (CPU) runs the same client and
transport on the tiny shapes, without registration (nothing is on a GPU).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time

import torch

logger = logging.getLogger("gpu_check")


def _meta(name: str, config: dict):
    from pivot.gps.layout import ModelMeta, ParamMeta
    from pivot.roles.titan.qwen2_config import Qwen2Shape

    shapes = Qwen2Shape.from_hf(config).hf_param_shapes()
    return ModelMeta(name, tuple(ParamMeta(n, tuple(s), "bfloat16") for n, s in shapes.items()))


def _draw(meta, device, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator(device=device).manual_seed(seed)
    return {p.name: torch.empty(p.shape, dtype=torch.bfloat16, device=device).normal_(
        generator=g) for p in meta.params}


def _shm_dir(nbytes: int) -> tuple[str | None, str]:
    """A shared-memory folder with room for two arenas of ``nbytes``, or (None, why)."""
    for d in ("/dev/shm", tempfile.gettempdir()):
        try:
            free = shutil.disk_usage(d).free
        except OSError:
            continue
        if free > 2 * nbytes + (1 << 30):
            return d, ""
    return None, f"no folder with {2 * nbytes / 1e9:.1f} GB free for two arenas"


def _one_model(setup, name: str, config: dict, repeats: int, peak_gbps: float | None) -> dict:
    from pivot.gps.client import GlobalParameterStorage
    from pivot.gps.layout import ParallelLayout, plan_storage
    from pivot.gps.pinned import PinnedArenas
    from pivot.gps.plan import Link
    from pivot.gps.storage import HostStore
    from pivot.gps.transport import MonarchTransport, ShmTransport

    meta = _meta(name, config)
    shm, why = _shm_dir(meta.nbytes)
    if shm is None:
        return {"model": name, "skipped": why}
    storage = plan_storage([meta], 1, meta.nbytes + (1 << 20))
    store = HostStore(0, storage, {name: meta}, shm_dir=shm)
    pinned = PinnedArenas()
    # MonarchTransport only as the remote entry of the map: every link here is local
    gps = GlobalParameterStorage([store], {name: meta}, storage, (0,),
                                 transports={Link.LOCAL: ShmTransport(pinned=pinned),
                                             Link.REMOTE: MonarchTransport()})
    layout = ParallelLayout.create(meta)
    try:
        params = _draw(meta, setup.device, seed=1)
        t0 = time.perf_counter()
        gps.load(name, params)          # the first Write: device -> a new staged arena
        setup.sync()
        first_write = time.perf_counter() - t0
        writes = []
        for _ in range(repeats):        # later Writes stage into a recycled arena
            t0 = time.perf_counter()
            gps.write(name, (0,), layout, {0: params})
            setup.sync()
            writes.append(time.perf_counter() - t0)
        for p in params.values():
            p.zero_()
        reads = []
        for _ in range(repeats + 1):    # the first Read registers its arena
            setup.sync()
            t0 = time.perf_counter()
            gps.read(name, (0,), layout, out={0: params})
            setup.sync()
            reads.append(time.perf_counter() - t0)
        want = _draw(meta, setup.device, seed=1)
        exact = all(bool(torch.equal(params[k], want[k])) for k in params)
        del want
    finally:
        gps.close()      # closes its transports: the arenas are unregistered
        store.close()
    nb = meta.nbytes
    later = sorted(reads[1:])
    out = {"model": name, "bytes": nb, "tensors": len(meta.params), "shm_dir": shm,
           "registered_bytes": pinned.registered_bytes,
           "first_write_s": first_write, "write_best_gbps": nb / min(writes) / 1e9,
           "first_read_s": reads[0], "read_best_gbps": nb / later[0] / 1e9,
           "read_median_gbps": nb / later[len(later) // 2] / 1e9, "read_seconds": later,
           "bit_exact": exact}
    if peak_gbps:
        out["read_over_peak"] = out["read_best_gbps"] / peak_gbps
    return out


def _gin_config() -> bool:
    """Whether ``import gin`` is gin-config. Without it, run from a checkout, ``gin`` is
    the repository's folder of .gin files, which imports as an empty namespace package
    (and ``pivot.gps.lease``'s ``@gin.configurable`` fails with an AttributeError)."""
    import importlib.util

    spec = importlib.util.find_spec("gin")
    return spec is not None and spec.origin not in (None, "namespace")


def gps_check(setup, repeats: int) -> dict:
    """Part d for every model of ``setup``; the peak from one plain (pinned) copy."""
    from pivot.gpu_check.common import missing_package, peak_h2d, why

    needs = "the product's GPS client needs numpy and gin-config"
    if not _gin_config():
        return {"skipped": f"{needs} (gin-config is not installed)"}
    try:
        import pivot.gps.client  # noqa: F401
        import pivot.gps.storage  # noqa: F401
    except ModuleNotFoundError as e:
        if missing_package(e) not in ("numpy", "gin"):
            raise
        return {"skipped": f"{needs} ({why(e)})"}
    peak = peak_h2d(setup, repeats)
    res = {"peak_h2d_best_gbps": peak["best_gbps"], "models": []}
    for name, cfg in setup.models.items():
        r = _one_model(setup, name, cfg, repeats, peak["best_gbps"])
        if "skipped" not in r:
            logger.info("GPS %s: %s bytes; Read best %.1f GB/s (%.2f of a pinned copy's "
                        "peak), first Read %.2f s; Write best %.1f GB/s, first %.2f s; "
                        "registered %.2f GB; bit-exact %s", name, f"{r['bytes']:,}",
                        r["read_best_gbps"], r.get("read_over_peak", float("nan")),
                        r["first_read_s"], r["write_best_gbps"], r["first_write_s"],
                        r["registered_bytes"] / 1e9, r["bit_exact"])
        else:
            logger.info("GPS %s: skipped (%s)", name, r["skipped"])
        res["models"].append(r)
    res["pid"] = os.getpid()
    return res


def gps_checks(res: dict, on_gpu: bool) -> dict[str, bool]:
    if "skipped" in res:
        return {}
    if "error" in res:
        return {"gps_ran": False}
    out = {"gps_ran": True}
    for r in res["models"]:
        if "skipped" in r:
            continue
        out[f"gps_read_bit_exact[{r['model']}]"] = r["bit_exact"]
        # on a GPU every arena read or written is registered, once: the staged arena of
        # the first Write and the recycled one (a host alternates between two)
        out[f"gps_arenas_registered[{r['model']}]"] = (
            r["registered_bytes"] in (r["bytes"], 2 * r["bytes"]) if on_gpu
            else r["registered_bytes"] == 0)
    return out
