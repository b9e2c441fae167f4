"""A plain GRPO loop on the built tiny policy, without the system: transformers samples,
the product's ``Trainer`` and GRPO batch train, on-policy (no staleness, no GenRM, no
engines, no GPS, no shifts). It answers one question about the local run's
convergence (docs/results.md, "Convergence (fig. 15)"): does the system learn as a plain
loop on the same data does?
A system bug (weights that do not reach the engines, misaligned log-probs, a batch built
wrong) would show as the two disagreeing; the same curve says the limit is the setting.

    .venv/bin/python experiments/reference_grpo.py --lr 1e-4 --prompts 32 --steps 20 \
        --out results/local/reference_grpo_1e-4.json

Reward: the verifiable one (R_GenRM needs the GenRM's engine). Validation: accuracy@1 on
the 128 problems the build and the RL run report (greedy, ``pivot.models.evaluate``), and
its part per problem level (the worked sum's steps), where the room to improve is.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="cache/models/policy")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--prompts", type=int, default=32, help="prompts per step")
    ap.add_argument("--n", type=int, default=4, help="responses per prompt")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--eval_every", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0, help="sampling seed (data: stream seed 0)")
    ap.add_argument("--max_tokens", type=int, default=128)
    ap.add_argument("--train_step_weights", default=None,
                    help="a curriculum: 10 comma-separated weights of 1..10-step sums in the "
                         "training batches (PromptStream.train_step_weights); validation "
                         "stays the build's")
    ap.add_argument("--out", default="results/local/reference_grpo.json")
    args = ap.parse_args()

    from transformers import AutoTokenizer, Qwen3ForCausalLM

    from pivot.models.evaluate import greedy_generate
    from pivot.rewards.verifiable import is_correct, verifiable_reward
    from pivot.roles.engine.config import read_hf_weights
    from pivot.rl.batch import build_train_batch
    from pivot.rl.data import PromptStream, record_fields
    from pivot.rl.trajectory import PromptGroup, Trajectory
    from pivot.roles.trainer import Trainer

    torch.manual_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(args.model)
    hf = Qwen3ForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    trainer = Trainer(Trainer.Config(model=args.model, max_seq_len=512,
                                     optimizer=Trainer.Optimizer(lr=args.lr)))
    trainer.setup()
    trainer.load_hf_state_dict(read_hf_weights(args.model))
    step_weights = (tuple(float(w) for w in args.train_step_weights.split(","))
                    if args.train_step_weights else None)
    stream = PromptStream(prompts_per_step=args.prompts, seed=0, num_val=128,
                          train_step_weights=step_weights)
    records = stream.validation()
    val = [record_fields(r) for r in records]
    levels = [r.get("extra_info", {}).get("level") for r in records]

    def accuracy() -> tuple[float, dict[str, float]]:
        """Accuracy@1 and, per problem level (steps of the worked sum), its part."""
        outs = greedy_generate(hf, tok, [v[0] for v in val], args.max_tokens)
        ok = [is_correct(o, v[2]) for o, v in zip(outs, val)]
        by: dict[str, list[bool]] = {}
        for lv, c in zip(levels, ok):
            by.setdefault(str(lv), []).append(c)
        return sum(ok) / len(ok), {k: sum(v) / len(v) for k, v in sorted(by.items())}

    acc, by_level = accuracy()
    rows: list[dict] = [{"step": 0, "val_acc": acc, "val_by_level": by_level}]
    print(f"step 0: validation accuracy@1 {rows[0]['val_acc']:.3f}", flush=True)
    eos, t0 = tok.eos_token_id, time.perf_counter()
    for step in range(args.steps):
        groups, correct = [], []
        for p, rec in enumerate(stream.batch(step)):
            text, question, truth = record_fields(rec)
            ids = tok(text)["input_ids"]
            with torch.no_grad():
                out = hf.generate(torch.tensor([ids]), do_sample=True, temperature=1.0,
                                  top_k=0, top_p=1.0, max_new_tokens=args.max_tokens,
                                  num_return_sequences=args.n, eos_token_id=eos,
                                  pad_token_id=tok.pad_token_id)
            trajs = []
            for j in range(args.n):
                resp = out[j, len(ids):].tolist()
                resp = resp[:resp.index(eos) + 1] if eos in resp else resp
                t = Trajectory(p * args.n + j, step, p, j, list(ids), truth, question, step)
                t.response_tokens = resp
                t.response_text = tok.decode(resp, skip_special_tokens=True)
                t.reward = verifiable_reward(t.response_text, truth)
                correct.append(t.reward)
                trajs.append(t)
            groups.append(PromptGroup(step, p, trajs))
        batch = build_train_batch(groups, tok.pad_token_id or 0, use_behaviour_logprobs=False)
        trainer.forward_backward(batch)
        trainer.optim_step()
        hf.load_state_dict(trainer.state_dict_hf(), strict=False)
        hf.tie_weights()
        row = {"step": step + 1, "sample_acc": sum(correct) / len(correct)}
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            row["val_acc"], row["val_by_level"] = accuracy()
        rows.append(row)
        print(f"step {step + 1}: sampled accuracy {row['sample_acc']:.3f}"
              + (f", validation accuracy@1 {row['val_acc']:.3f}" if "val_acc" in row else ""),
              flush=True)
    out = {"settings": vars(args), "wall_s": time.perf_counter() - t0, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
