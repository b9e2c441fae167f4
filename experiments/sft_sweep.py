"""Sweeps the policy's SFT recipe and says what each run has learned: how robust is the
build's policy to its seed, its learning rate and the machine's summation order?

    .venv/bin/python experiments/sft_sweep.py --lr 5e-3 2e-3 --seeds 1 2 3 \
        --out results/local/sft_sweep.json

Every run trains the build's policy (``BuildConfig``'s data, tokenizer, architecture and
schedule, with the swept field replaced) and reports the build's validation accuracy@1
(the 128 problems the RL run reports), the accuracy on ``--per_level`` fresh problems of
each step count 1-10, and where the wrong responses first go wrong
(``pivot.models.evaluate.first_step_error``). ``--threads 1`` stands in for another
machine: the build's weights are bit-identical for one thread count, not across them.
The GenRM is not trained (it does not depend on these fields but on the policy's outputs).
``--save DIR`` keeps each run's policy (HF format) for ``experiments/reference_grpo.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import logging
import random
from collections import Counter
from pathlib import Path

import torch


def chain_report(model, tok, per_level: int, seed: int = 123) -> dict:
    """Greedy accuracy on ``per_level`` fresh chains of each step count and the counts of
    the wrong responses' first errors."""
    from pivot.data.chains import MAX_STEPS, sample_chain
    from pivot.models.build import POLICY_MAX_NEW_TOKENS
    from pivot.models.evaluate import first_step_error, greedy_generate
    from pivot.models.examples import policy_prompt

    rng = random.Random(seed)
    by_level, errors = {}, Counter()
    for steps in range(1, MAX_STEPS + 1):
        probs = [sample_chain(rng, steps) for _ in range(per_level)]
        outs = greedy_generate(model, tok, [policy_prompt(p) for p in probs],
                               POLICY_MAX_NEW_TOKENS)
        kinds = [first_step_error(p, o) for p, o in zip(probs, outs)]
        by_level[steps] = round(sum(k is None for k in kinds) / per_level, 3)
        errors.update(k for k in kinds if k is not None)
    return {"by_level": by_level, "first_errors": dict(errors.most_common())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lr", type=float, nargs="+", default=[5e-3])
    ap.add_argument("--steps", type=int, nargs="+", default=[None],
                    help="SFT steps (default: the build's)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1])
    ap.add_argument("--threads", type=int, nargs="+", default=[2])
    ap.add_argument("--per_level", type=int, default=64)
    ap.add_argument("--out", default="results/local/sft_sweep.json")
    ap.add_argument("--save", default=None,
                    help="folder to save each run's policy in (HF format, with its "
                         "tokenizer; a subfolder per run), e.g. for reference_grpo.py")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    from pivot.models.build import evaluate_policy, policy_data, save_model, train_model
    from pivot.models.config import BuildConfig

    cfg = BuildConfig()
    _, examples, tok = policy_data(cfg)
    runs = []
    for lr, steps, seed, threads in itertools.product(args.lr, args.steps, args.seeds,
                                                      args.threads):
        torch.set_num_threads(threads)
        sft = dataclasses.replace(cfg.policy_sft, lr=lr, seed=seed,
                                  steps=steps or cfg.policy_sft.steps)
        model, info = train_model("policy", cfg.arch, tok, examples, sft)
        val = evaluate_policy(model, tok, cfg)
        run = {"lr": lr, "steps": sft.steps, "seed": seed, "threads": threads,
               "sft_seconds": info["sft_seconds"], "final_loss": info["final_loss"],
               "val_accuracy_at_1": round(val.accuracy_at_1, 4),
               **chain_report(model, tok, args.per_level)}
        if args.save:
            run["saved"] = str(Path(args.save) / f"lr{lr:g}_steps{sft.steps}_seed{seed}"
                                                  f"_threads{threads}")
            save_model(model, tok, Path(run["saved"]))
        runs.append(run)
        lv = run["by_level"]
        print(f"lr {lr:g} steps {sft.steps} seed {seed} threads {threads}: "
              f"val acc@1 {run['val_accuracy_at_1']:.3f}, 1 step {lv[1]:.2f}, 2-4 steps "
              f"{sum(lv[k] for k in (2, 3, 4)) / 3:.2f}, 5-10 steps "
              f"{sum(lv[k] for k in range(5, 11)) / 6:.2f}; first errors "
              f"{run['first_errors']} ({info['sft_seconds']:.0f} s)", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"build_digest": cfg.digest(), "per_level": args.per_level,
                               "runs": runs}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
