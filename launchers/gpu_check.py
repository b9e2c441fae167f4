"""What one GPU can prove of the cluster backend before a ``cuda`` run, in one command.

Measures and checks, then writes JSON (``--out``, default ``results/gpu/gpu_check.json``):

a. Read bandwidth (sec. 5.1): a GPS-like pinned host arena (one flat pinned bf16 buffer
   holding every parameter of Qwen2.5-1.5B, then of Qwen2.5-7B: real shapes from their
   config.json, dummy values) is copied slice by slice into preallocated device
   parameters; against the peak of one plain large pinned host-to-device copy measured in
   the same run (the ratio), and one copy of the whole arena. Every parameter is checked
   bit-exact after the Read.
b. A GRPO step and a shift (sec. 5.2, 8.1): the Qwen2 trainer model at Qwen2.5-0.5B
   shapes (random weights; fp32 master weights, bf16 autocast) takes a GRPO step
   (``pivot.losses.grpo``); its parameters, gradients and AdamW state go to pinned host
   memory (``HostStash``) and back; ``torch.cuda.mem_get_info`` before and after says
   how much device memory was really returned; everything must come back bit-exact, and
   the next step must give the same loss as the same step with no offload.
c. The product's trainer (``pivot.roles.trainer.Trainer``, ``pivot/gpu_check/trainer.py``):
   bf16, built on the meta device, filled by rows from a safetensors checkpoint, a GRPO
   step, a shift down (offload + release) with the device memory returned and a shift up
   whose log-probs equal the checkpoint's bit for bit.
d. The product's GPS path (``pivot/gpu_check/gps.py``): its client and host-local
   transport Write device parameters into a ``/dev/shm`` arena and Read them back into
   preallocated device parameters at Qwen2.5-1.5B and 7B shapes, each arena registered
   with the CUDA driver once (``pivot.gps.pinned``); GB/s against part a's kind of peak,
   bit-exact.

The model is torchtitan's (``pivot.roles.titan.qwen2``) when torchtitan imports and runs
on this torch; otherwise transformers' ``Qwen2ForCausalLM`` (same maths; the JSON says
which, and why; ``--model`` forces one). A part that fails is recorded in the JSON and the
others still run.

What it imports: torch, always (``--help`` and part a need nothing else); nothing of vLLM,
Monarch or NIXL, on any path. The GPU machine it is meant for may lack more than those, so
a part whose packages are missing is skipped, with the reason in the JSON (``skipped``:
part -> why) and on the console, and is not a failure:

- b needs torchtitan, or transformers (which needs numpy);
- c needs torchtitan (and triton, which it imports) and safetensors; numpy is not needed
  (without it the checkpoint is written by hand, in the same format);
- d needs numpy and gin-config (the product's GPS client: ``pivot.gps.layout`` computes
  with numpy, ``pivot.gps.lease`` is gin-configurable).

Anything else that goes wrong, a missing package's failure included where ``--model``
asked for it, fails the run.

Without CUDA it exits with code 2, unless ``--cpu_dry_run``: then the same code paths run
on tiny shapes on the CPU, in plain (unpinned) memory, so CI runs them.

    python launchers/gpu_check.py [--out results/gpu/gpu_check.json]
                                  [--only bandwidth|step|trainer|gps]
                                  [--model auto|torchtitan|transformers] [--repeats 5]
    python launchers/gpu_check.py --cpu_dry_run --out /tmp/gpu_check.json

Exit code: 0 when every check passes, 1 when one fails, 2 when there is no GPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys
import time
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if __package__ in (None, "") and str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run as a file from a checkout where pivot is not installed

import torch  # noqa: E402

from pivot.gpu_check.common import (GiB, Setup, _gbps, _size,  # noqa: E402
                                    missing_package, peak_h2d, timed, why)
from pivot.roles.titan.qwen2_config import Qwen2Shape  # noqa: E402

logger = logging.getLogger("gpu_check")


# ---------------------------------------------------------------- a. Read bandwidth
def _read(params: dict, arena: torch.Tensor, slices: dict, non_blocking: bool) -> None:
    """The Read: one copy per parameter from its slice of the arena."""
    for n, p in params.items():
        o, k = slices[n]
        p.view(-1).copy_(arena[o:o + k], non_blocking=non_blocking)


def arena_read(setup: Setup, name: str, config: dict, repeats: int) -> dict:
    """A GPS-like arena (one flat bf16 host buffer, each parameter a slice of it) Read into
    preallocated device parameters, one copy per parameter, and as one flat copy."""
    shapes = Qwen2Shape.from_hf(config).hf_param_shapes()
    slices, off = {}, 0
    for n, s in shapes.items():
        k = 1
        for d in s:
            k *= d
        slices[n] = (off, k)
        off += k
    total = off
    nbytes = total * 2
    t0 = time.perf_counter()
    arena = torch.empty(total, dtype=torch.bfloat16, pin_memory=setup.pinned)
    alloc_s = time.perf_counter() - t0
    params = {n: torch.empty(s, dtype=torch.bfloat16, device=setup.device)
              for n, s in shapes.items()}
    gen = torch.Generator(device=setup.device).manual_seed(0)
    for n, p in params.items():  # dummy values: drawn on the device, written to the arena
        p.normal_(generator=gen)
        o, k = slices[n]
        arena[o:o + k].copy_(p.view(-1))
        p.zero_()
    setup.sync()

    sliced = timed(setup, partial(_read, params, arena, slices, setup.pinned), repeats + 1)[1:]
    exact = all(bool(torch.equal(p.view(-1), arena[o:o + k].to(setup.device)))
                for (o, k), p in ((slices[n], p) for n, p in params.items()))
    flat_res: dict = {"skipped": "not enough free device memory for a second copy"}
    free = setup.free_bytes()
    if free is None or free > nbytes + GiB:
        flat = torch.empty(total, dtype=torch.bfloat16, device=setup.device)
        flat_t = timed(setup, partial(flat.copy_, arena, non_blocking=setup.pinned),
                       repeats + 1)[1:]
        flat_res = _gbps(nbytes, flat_t)
        del flat
    del arena, params
    setup.free_bytes()
    return {"model": name, "params": total, "bytes": nbytes, "tensors": len(shapes),
            "pinned": setup.pinned, "arena_alloc_seconds": alloc_s,
            "sliced_read": _gbps(nbytes, sliced), "flat_read": flat_res,
            "bit_exact": exact}


def bandwidth(setup: Setup, repeats: int) -> dict:
    peak = peak_h2d(setup, repeats)
    logger.info("peak H2D (one %d MiB copy%s): best %.1f GB/s, median %.1f GB/s",
                peak["bytes"] >> 20, ", pinned" if setup.pinned else "",
                peak["best_gbps"], peak["median_gbps"])
    reads = []
    for name, cfg in setup.models.items():
        r = arena_read(setup, name, cfg, repeats)
        r["sliced_over_peak"] = r["sliced_read"]["best_gbps"] / peak["best_gbps"]
        flat = r["flat_read"].get("best_gbps")
        logger.info("Read %s: %s in %d slices: best %.1f GB/s (%.2f of peak), one flat "
                    "copy %s GB/s; arena allocated in %.1f s; bit-exact %s", name,
                    _size(r["bytes"]), r["tensors"], r["sliced_read"]["best_gbps"],
                    r["sliced_over_peak"], "n/a" if flat is None else f"{flat:.1f}",
                    r["arena_alloc_seconds"], r["bit_exact"])
        reads.append(r)
    return {"peak_h2d": peak, "reads": reads}


# ---------------------------------------------------------------- b. GRPO step + shift
def build_policy(setup: Setup, config: dict, seq: int, model: str, seed: int = 0):
    """(module, forward(ids) -> logits, description, why not torchtitan): torchtitan's
    Qwen2 when ``model`` allows it and it builds on this torch, else transformers'
    Qwen2ForCausalLM."""
    why_not = "--model transformers"
    if model != "transformers":
        try:
            from pivot.roles.titan.qwen2 import build_qwen2, qwen2_model_config

            mc = qwen2_model_config(Qwen2Shape.from_hf(config), max_seq_len=seq)
            m = build_qwen2(mc, device=setup.device, seed=seed)
            return m, m, "torchtitan Qwen2 (pivot.roles.titan.qwen2)", None
        except Exception as e:  # noqa: BLE001  (torchtitan absent or not working on this torch: fall back, recorded)
            if model == "torchtitan":
                raise
            why_not = why(e)
            logger.info("torchtitan Qwen2 unavailable (%s); using transformers' "
                        "Qwen2ForCausalLM", why_not)
    import transformers

    keep = {k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")}
    torch.manual_seed(seed)
    with torch.device(setup.device):
        m = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**keep))
    return m, (lambda ids: m(ids).logits), "transformers Qwen2ForCausalLM", why_not


def grpo_batch(setup: Setup, vocab: int, seed: int):
    from pivot.losses.grpo import group_advantages

    rows, length, prompt = setup.batch
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, length), generator=g)
    mask = torch.zeros(rows, length)
    for i in range(rows):
        end = int(torch.randint(prompt + 4, length + 1, (1,), generator=g))
        mask[i, prompt:end] = 1
        ids[i, end:] = 0
    adv = group_advantages(torch.rand(rows, generator=g), group_size=4)
    noise = 0.1 * torch.randn(rows, length, generator=g)
    return [t.to(setup.device) for t in (ids, mask, adv, noise)]


class Policy:
    """The trainer's step on one device: GRPO loss on bf16-autocast log-probs, global-norm
    clip, AdamW; gradients stay after the step so a shift has all three kinds to move."""

    def __init__(self, setup: Setup, config: dict, model: str) -> None:
        from pivot.losses.grpo import GRPOLoss

        self.setup = setup
        self.model, self.forward, self.kind, self.fallback_reason = build_policy(
            setup, config, setup.batch[1], model)
        self.params = list(self.model.parameters())
        self.opt = torch.optim.AdamW(self.params, lr=1e-5, weight_decay=0.01)
        self.loss = GRPOLoss(GRPOLoss.Config())

    def logprobs(self, ids):
        from pivot.losses.grpo import token_logprobs

        with torch.autocast(self.setup.device.type, dtype=torch.bfloat16):
            logits = self.forward(ids)
        return token_logprobs(logits, ids)

    def behaviour(self, batch):
        """The batch with its old log-probs: the current policy's plus noise (a rollout
        policy a few versions behind), fixed before any step."""
        ids, mask, adv, noise = batch
        with torch.no_grad():
            old = (self.logprobs(ids) + noise) * mask
        return ids, mask, adv, old

    def step(self, batch) -> float:
        ids, mask, adv, old = batch
        self.opt.zero_grad(set_to_none=True)
        lp = self.logprobs(ids)
        loss, _ = self.loss(lp, old, adv, mask)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()
        return float(loss.detach())

    def tensors(self, device_only: bool = True) -> dict[str, torch.Tensor]:
        """The role's tensors by a stable name: parameters, gradients, AdamW state. With
        ``device_only``, AdamW's step counters (host tensors on a GPU) are left out."""
        out = {}
        for i, p in enumerate(self.params):
            out[f"param.{i}"] = p.data
            if p.grad is not None:
                out[f"grad.{i}"] = p.grad
            for k, v in self.opt.state.get(p, {}).items():
                if isinstance(v, torch.Tensor) and (v.device == self.setup.device
                                                    or not device_only):
                    out[f"opt.{i}.{k}"] = v
        return out

    def snapshot(self) -> dict[str, torch.Tensor]:
        """Host copies of everything a step reads (step counters included)."""
        return {k: v.detach().to("cpu", copy=True)
                for k, v in self.tensors(device_only=False).items()}

    def restore(self, snap: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for k, v in self.tensors(device_only=False).items():
                if not k.startswith("grad."):
                    v.copy_(snap[k])
            for i, p in enumerate(self.params):
                p.grad = snap[f"grad.{i}"].to(self.setup.device)


def storage_total(tensors) -> int:
    from pivot.roles.titan.context import storage_bytes

    return storage_bytes(tensors)


def _max_diff(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    return max(float((got[k].float() - v.float()).abs().max()) for k, v in want.items())


def grpo_shift(setup: Setup, model: str = "auto") -> dict:
    """One GRPO step, then offload -> reload against a snapshot and a no-offload twin.

    ``model``: "auto" (torchtitan, else transformers; also when torchtitan's model fails
    mid-step; skipped, with the reason, when neither package is there), "torchtitan" or
    "transformers"."""
    if model == "auto":
        try:
            return grpo_shift(setup, "torchtitan")
        except Exception as e:  # noqa: BLE001  (torchtitan fails on this torch: the step runs on transformers' model, recorded)
            titan_error = e
            logger.info("torchtitan Qwen2 failed (%s); rerunning on transformers' model",
                        why(e))
        gc.collect()
        setup.free_bytes()
        try:
            res = grpo_shift(setup, "transformers")
        except ModuleNotFoundError as e:
            if not (missing_package(e) and missing_package(titan_error)):
                raise
            return {"skipped": f"no model to step: torchtitan's Qwen2 ({why(titan_error)}) "
                               f"and transformers' ({why(e)}) do not import"}
        res["fallback_reason"] = why(titan_error)
        return res
    from pivot.roles.titan.context import HostStash

    name, config = setup.step_model
    pol = Policy(setup, config, model)
    vocab = int(config["vocab_size"])
    b1, b2 = (pol.behaviour(grpo_batch(setup, vocab, seed)) for seed in (1, 2))
    t0 = time.perf_counter()
    loss1 = pol.step(b1)
    setup.sync()
    step_s = time.perf_counter() - t0
    snap = pol.snapshot()
    # two twins of the next step with no offload: the second tells how far the kernels
    # themselves (atomics in some backward kernels) move the weights between equal runs
    ref_loss2 = pol.step(b2)
    ref_params = {k: v for k, v in pol.snapshot().items() if k.startswith("param.")}
    pol.restore(snap)
    pol.step(b2)
    floor = _max_diff(pol.snapshot(), ref_params)
    pol.restore(snap)

    held = storage_total(pol.tensors().values())
    free_before = setup.free_bytes()
    stash = HostStash()
    off_bytes, off_s = stash.offload(list(pol.tensors().values()))
    free_after = setup.free_bytes()
    left = storage_total(pol.tensors().values())
    pinned_ok = all(c.is_pinned() for _, c, _ in stash.entries) if setup.pinned else None
    back_bytes, back_s = stash.reload()
    got = pol.snapshot()
    exact = {kind: all(torch.equal(got[k], snap[k]) for k in snap if k.startswith(kind))
             for kind in ("param.", "grad.", "opt.")}
    loss2 = pol.step(b2)
    diff = _max_diff(pol.snapshot(), ref_params)
    returned = None if free_before is None else free_after - free_before
    res = {
        "model": name, "implementation": pol.kind, "fallback_reason": pol.fallback_reason,
        "params": sum(p.numel() for p in pol.params), "batch_rows_len_prompt": setup.batch,
        "precision": "fp32 master weights and AdamW state, bf16 autocast forward/backward",
        "step1_loss": loss1, "step1_seconds": step_s,
        "offload": {"bytes": off_bytes, "seconds": off_s, "pinned": pinned_ok,
                    "tensor_bytes_before": held, "tensor_bytes_after": left,
                    "device_free_before": free_before, "device_free_after": free_after,
                    "device_returned": returned,
                    "returned_over_offloaded": None if returned is None
                    else returned / off_bytes},
        "reload": {"bytes": back_bytes, "seconds": back_s},
        "bit_exact_after_reload": exact,
        "step2_loss_after_reload": loss2, "step2_loss_no_offload": ref_loss2,
        "step2_loss_equal": loss2 == ref_loss2,
        "step2_params_max_abs_diff": diff,
        "step2_params_max_abs_diff_between_twins": floor,
    }
    logger.info("GRPO step on %s (%s, %.0fM params): loss %.6f in %.2f s", name, pol.kind,
                res["params"] / 1e6, loss1, step_s)
    logger.info("offload %s in %.2f s (pinned %s), device memory returned %s, reload "
                "%.2f s; bit-exact %s; next-step loss %r vs %r without offload, params max "
                "diff %.3g (%.3g between two runs without offload)", _size(off_bytes), off_s,
                pinned_ok, "n/a (CPU)" if returned is None else _size(returned), back_s,
                exact, loss2, ref_loss2, diff, floor)
    return res


def checks(res: dict) -> dict[str, bool]:
    out: dict[str, bool] = {f"{k}_ran": "error" not in res[k]
                            for k in ("bandwidth", "grpo_shift")
                            if k in res and "skipped" not in res[k]}
    if out.get("bandwidth_ran"):
        bw = res["bandwidth"]
        out["peak_copy_right"] = bw["peak_h2d"]["copied_right"]
        for r in bw["reads"]:
            out[f"read_bit_exact[{r['model']}]"] = r["bit_exact"]
    if out.get("grpo_shift_ran"):
        g = res["grpo_shift"]
        out.update({f"bit_exact[{k.rstrip('.')}]": v
                    for k, v in g["bit_exact_after_reload"].items()})
        out["all_tensor_storage_freed"] = g["offload"]["tensor_bytes_after"] == 0
        out["next_step_loss_equal"] = g["step2_loss_equal"]
        # bit-exact where the kernels are deterministic; else within their own spread
        out["next_step_params_equal"] = (g["step2_params_max_abs_diff"]
                                         <= g["step2_params_max_abs_diff_between_twins"])
        if g["offload"]["pinned"] is not None:
            out["host_copies_pinned"] = g["offload"]["pinned"]
        ratio = g["offload"]["returned_over_offloaded"]
        if ratio is not None:
            out["device_memory_returned_>=95%"] = ratio >= 0.95
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "results" / "gpu" / "gpu_check.json"))
    ap.add_argument("--cpu_dry_run", action="store_true",
                    help="no GPU: run the same code on tiny shapes on the CPU (for CI)")
    ap.add_argument("--only", choices=("bandwidth", "step", "trainer", "gps"), default=None)
    ap.add_argument("--model", choices=("auto", "torchtitan", "transformers"), default="auto",
                    help="the step's model: torchtitan's Qwen2, transformers', or the first "
                         "that works (default)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    if not args.cpu_dry_run and not torch.cuda.is_available():
        print("gpu_check: no CUDA device (torch.cuda.is_available() is False); run it on a "
              "GPU machine, or pass --cpu_dry_run for the tiny CPU run", file=sys.stderr)
        return 2
    setup = Setup(args.cpu_dry_run)
    if not setup.dry_run:  # deterministic cuBLAS, so the twin steps compare bit for bit
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch.utils.deterministic as det

    saved = (torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(), det.fill_uninitialized_memory)
    torch.use_deterministic_algorithms(True, warn_only=True)
    det.fill_uninitialized_memory = False  # else every empty/resize_ is filled (and timed)
    try:
        return run(setup, args)
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        det.fill_uninitialized_memory = saved[2]


def section(res: dict, name: str, fn, *args) -> None:
    """Runs one part; a failure is recorded (and fails the check ``<name>_ran``) so the
    other part's figures are still written."""
    try:
        res[name] = fn(*args)
    except Exception as e:  # noqa: BLE001  (recorded in the JSON and failing the run; the next part still runs)
        import traceback

        logger.error("%s failed: %s: %s", name, type(e).__name__, e)
        res[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}


def run(setup: Setup, args: argparse.Namespace) -> int:
    res: dict = {"mode": "cpu_dry_run" if setup.dry_run else "cuda",
                 "torch": torch.__version__, "cuda": torch.version.cuda,
                 "device": (torch.cuda.get_device_name() if not setup.dry_run else "cpu"),
                 "argv": sys.argv[1:]}
    t0 = time.perf_counter()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.only in (None, "bandwidth"):
        section(res, "bandwidth", bandwidth, setup, args.repeats)
        out.write_text(json.dumps(res, indent=1, default=str))
    if args.only in (None, "step"):
        section(res, "grpo_shift", grpo_shift, setup, args.model)
        out.write_text(json.dumps(res, indent=1, default=str))
    if args.only in (None, "trainer"):
        from pivot.gpu_check.trainer import trainer_check, trainer_checks

        section(res, "trainer", trainer_check, setup, grpo_batch)
        out.write_text(json.dumps(res, indent=1, default=str))
    if args.only in (None, "gps"):
        from pivot.gpu_check.gps import gps_check

        section(res, "gps", gps_check, setup, args.repeats)
    res["checks"] = checks(res)
    if "trainer" in res:
        res["checks"].update(trainer_checks(res["trainer"]))
    if "gps" in res:
        from pivot.gpu_check.gps import gps_checks

        res["checks"].update(gps_checks(res["gps"], on_gpu=not setup.dry_run))
    res["skipped"] = {k: v["skipped"] for k, v in res.items()
                      if isinstance(v, dict) and "skipped" in v}
    res["passed"] = all(res["checks"].values())
    res["seconds"] = time.perf_counter() - t0
    out.write_text(json.dumps(res, indent=1, default=str))
    failed = [k for k, v in res["checks"].items() if not v]
    for part, reason in res["skipped"].items():
        logger.info("%s skipped: %s", part, reason)
    logger.info("%s in %.0f s; %s%s; wrote %s", "PASSED" if not failed else "FAILED",
                res["seconds"], f"failed: {failed}" if failed else "all checks pass",
                f" (skipped: {', '.join(res['skipped'])})" if res["skipped"] else "", out)
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
