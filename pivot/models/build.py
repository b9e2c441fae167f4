"""Builds the two tokenizers and the two tiny models into the cache, once per configuration.

Layout under ``<cache>/models``::

    tokenizer/   the policy's tokenizer (each model folder holds its own tokenizer, so vLLM
                 and transformers can load a model folder on its own)
    policy/      Qwen3ForCausalLM, SFT-trained to write worked steps and ``Answer: N``
    genrm/       LlamaForCausalLM (larger, its own tokenizer), SFT-trained to check a
                 response step by step and end with ``Score: N``
    manifest.json  the build config, its hash, and the measured results

The same config gives the same weights (seeded init and data order, on one thread count).
Both models are evaluated on the validation set the RL run reports (``PromptStream``'s
``num_val`` problems of the same seed), with the RL run's generation caps.

A build whose manifest hash matches the requested config is reused; any other is rebuilt.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (GenerationConfig, LlamaForCausalLM, PreTrainedModel,
                          PreTrainedTokenizerFast, Qwen3ForCausalLM)

from pivot.data.dataset import training_problems, validation_problems
from pivot.models.config import ArchConfig, BuildConfig, hf_config
from pivot.models.evaluate import GenRMEval, PolicyEval, greedy_generate, pearson
from pivot.data.arithmetic import Problem
from pivot.models.examples import (Example, candidate_response, genrm_example, judged_example,
                                   policy_example, policy_prompt)
from pivot.models.sft import SFTConfig, train_sft
from pivot.models.tokenizer import GENRM_SPECIAL_TOKENS, train_tokenizer
from pivot.rewards.genrm import build_genrm_prompt, parse_genrm_score
from pivot.rewards.verifiable import extract_answer, is_correct

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
POLICY_MAX_NEW_TOKENS = 128
"""The RL run's response cap (``ClusterGroup.max_response_tokens``): 10 worked steps take
about 95 tokens."""
GENRM_MAX_NEW_TOKENS = 128
"""The RL run's judgement cap (``ClusterGroup.max_judge_tokens``): a check of 10 steps takes
about 100 tokens."""
CLASSES = {"qwen3": Qwen3ForCausalLM, "llama": LlamaForCausalLM}


@dataclass(frozen=True, slots=True)
class ModelPaths:
    """Folders of the built models (each loadable with ``from_pretrained``)."""

    policy: Path
    genrm: Path
    tokenizer: Path


def default_cache_dir() -> Path:
    """``$PIVOT_CACHE`` if set, else ``<repo>/cache``."""
    env = os.environ.get("PIVOT_CACHE")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "cache"


def paths(cache_dir: str | os.PathLike[str] | None = None) -> ModelPaths:
    root = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / "models"
    return ModelPaths(root / "policy", root / "genrm", root / "tokenizer")


def read_manifest(cache_dir: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
    """The manifest of the build in ``cache_dir``, or None if there is none."""
    f = paths(cache_dir).policy.parent / MANIFEST
    if not f.is_file():
        return None
    return json.loads(f.read_text())


def is_built(cache_dir: str | os.PathLike[str] | None = None,
             cfg: BuildConfig = BuildConfig()) -> bool:
    man = read_manifest(cache_dir)
    p = paths(cache_dir)
    return (man is not None and man.get("digest") == cfg.digest()
            and all((d / "config.json").is_file() for d in (p.policy, p.genrm))
            and (p.tokenizer / "tokenizer.json").is_file())


def evaluate_policy(model, tok, cfg: BuildConfig) -> PolicyEval:
    val = validation_problems(cfg.task)
    outs = greedy_generate(model, tok, [policy_prompt(p) for p in val], POLICY_MAX_NEW_TOKENS)
    ok = [is_correct(o, str(p.answer)) for o, p in zip(outs, val)]
    levels = sorted({p.level for p in val})
    by_level = {lv: sum(c for c, p in zip(ok, val) if p.level == lv)
                / max(1, sum(p.level == lv for p in val)) for lv in levels}
    return PolicyEval(sum(ok) / len(ok), sum(extract_answer(o) is not None for o in outs)
                      / len(outs), by_level)


def judge_responses(model, tok, problems: list[Problem], responses: list[str]) -> GenRMEval:
    """Pearson r of the GenRM's score and the verifiable correctness of ``responses``
    (``tok``: the GenRM's tokenizer; only text crosses)."""
    outs = greedy_generate(model, tok, [build_genrm_prompt(p.question, r)
                                        for p, r in zip(problems, responses)],
                           GENRM_MAX_NEW_TOKENS)
    parsed = [parse_genrm_score(o) for o in outs]
    correct = [float(is_correct(r, str(p.answer))) for r, p in zip(responses, problems)]
    scores = [s.score for s in parsed]
    right = [s for s, c in zip(scores, correct) if c]
    wrong = [s for s, c in zip(scores, correct) if not c]
    return GenRMEval(pearson(scores, correct), sum(s.ok for s in parsed) / len(parsed),
                     sum(right) / max(1, len(right)), sum(wrong) / max(1, len(wrong)),
                     len(parsed))


def evaluate_genrm(model, tok, cfg: BuildConfig, policy=None, policy_tok=None
                   ) -> dict[str, Any]:
    """The GenRM on held-out (validation) problems: on synthetic candidates and, given the
    policy, on the policy's own greedy responses (the pairs it will judge in RL)."""
    rng = random.Random(cfg.task.seed + 7)
    val = validation_problems(cfg.task)
    probs = [val[i % len(val)] for i in range(cfg.genrm_eval_pairs)]
    out = {"synthetic": asdict(judge_responses(
        model, tok, probs, [candidate_response(rng, p) for p in probs]))}
    if policy is not None:
        responses = greedy_generate(policy, policy_tok, [policy_prompt(p) for p in val],
                                    POLICY_MAX_NEW_TOKENS)
        out["policy_outputs"] = asdict(judge_responses(model, tok, val, responses))
    return out


def genrm_examples(cfg: BuildConfig, problems: list[Problem], policy, tok) -> list[Example]:
    """The GenRM's SFT set: synthetic candidates, plus (when ``policy`` is given) the
    policy's own greedy responses, whose near misses synthetic noise does not cover."""
    rng = random.Random(cfg.task.seed + 3)
    n_pol = cfg.genrm_policy_candidates if policy is not None else 0
    synth = [genrm_example(rng, q) for q in problems[:cfg.genrm_examples - n_pol]]
    own = problems[cfg.genrm_examples - n_pol:cfg.genrm_examples]
    if not own:
        return synth
    responses = greedy_generate(policy, tok, [policy_prompt(q) for q in own],
                                POLICY_MAX_NEW_TOKENS)
    return synth + [judged_example(q, r) for q, r in zip(own, responses)]


def policy_data(cfg: BuildConfig) -> tuple[list[Problem], list[Example],
                                          PreTrainedTokenizerFast]:
    """The build's SFT problems (the GenRM's too), the policy's examples, and the policy's
    tokenizer trained on the first ``tokenizer_corpus`` of them."""
    problems = training_problems(cfg.task, max(cfg.policy_examples, cfg.genrm_examples),
                                 offset=10**6)  # an offset no RL stream starts near
    pol = [policy_example(q) for q in problems[:cfg.policy_examples]]
    tok = train_tokenizer([e.prompt + e.target for e in pol[:cfg.tokenizer_corpus]],
                          cfg.vocab_size, cfg.arch.max_position_embeddings)
    return problems, pol, tok


def train_model(name: str, arch: ArchConfig, tok: PreTrainedTokenizerFast,
                examples: list[Example], sft: SFTConfig
                ) -> tuple[PreTrainedModel, dict[str, Any]]:
    """A freshly initialised model of ``arch`` (seeded by ``sft.seed``) after SFT on
    ``examples``, and what the manifest records of it."""
    torch.manual_seed(sft.seed)
    model = CLASSES[arch.family](hf_config(arch, len(tok), tok.bos_token_id,
                                           tok.eos_token_id, tok.pad_token_id))
    t0 = time.perf_counter()
    logger.info("training the %s: %d SFT steps", name, sft.steps)

    def progress(step: int, steps: int, seconds: float) -> None:
        logger.info("  %s SFT %d/%d steps, %.0f s", name, step, steps, seconds)

    losses = train_sft(model, tok, examples, sft, progress)
    return model, {"architecture": type(model).__name__,
                   "params": sum(x.numel() for x in model.parameters()),
                   "sft_seconds": round(time.perf_counter() - t0, 1),
                   "final_loss": round(sum(losses[-10:]) / len(losses[-10:]), 4)}


def save_model(model, tok, out: Path) -> None:
    """Writes ``model`` and ``tok`` to ``out`` in HF format (replacing it), greedy by default."""
    if out.exists():
        shutil.rmtree(out)
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, do_sample=False)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


def build_models(cache_dir: str | os.PathLike[str] | None = None,
                 cfg: BuildConfig = BuildConfig(), threads: int = 2) -> dict[str, Any]:
    """Trains the tokenizer and both models, saves them, and returns the manifest.

    ``threads`` (torch threads while building) is not part of the config hash: it changes
    the floating-point summation order, not the recipe.
    """
    t_start = time.perf_counter()
    p = paths(cache_dir)
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(cfg.task.seed)
        problems, pol, tok = policy_data(cfg)
        n = cfg.tokenizer_corpus
        gtok = train_tokenizer([e.prompt + e.target
                                for e in genrm_examples(cfg, problems[:n], None, None)],
                               cfg.genrm_vocab_size, cfg.genrm_arch.max_position_embeddings,
                               specials=GENRM_SPECIAL_TOKENS)
        results: dict[str, Any] = {"vocab": len(tok), "genrm_vocab": len(gtok)}

        policy, results["policy"] = train_model("policy", cfg.arch, tok, pol, cfg.policy_sft)
        results["policy"].update(asdict(evaluate_policy(policy, tok, cfg)))
        r = results["policy"]
        logger.info("policy built: %d parameters, SFT %.0f s, accuracy@1 %.2f", r["params"],
                    r["sft_seconds"], r["accuracy_at_1"])
        logger.debug("policy: %s", r)
        save_model(policy, tok, p.policy)
        genrm, results["genrm"] = train_model("genrm", cfg.genrm_arch, gtok,
                                              genrm_examples(cfg, problems, policy, tok),
                                              cfg.genrm_sft)
        results["genrm"].update(evaluate_genrm(genrm, gtok, cfg, policy, tok))
        logger.info("GenRM built: %d parameters, SFT %.0f s", results["genrm"]["params"],
                    results["genrm"]["sft_seconds"])
        logger.debug("genrm: %s", results["genrm"])
        save_model(genrm, gtok, p.genrm)
        if p.tokenizer.exists():
            shutil.rmtree(p.tokenizer)
        tok.save_pretrained(p.tokenizer)
    finally:
        torch.set_num_threads(old_threads)
    manifest = {"digest": cfg.digest(), "config": cfg.to_dict(), "results": results,
                "threads": threads,
                "build_seconds": round(time.perf_counter() - t_start, 1)}
    (p.policy.parent / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str))
    return manifest


def ensure_models(cache_dir: str | os.PathLike[str] | None = None,
                  cfg: BuildConfig = BuildConfig(), threads: int = 2) -> ModelPaths:
    """The model folders, built first if missing or built from another config."""
    if not is_built(cache_dir, cfg):
        logger.info("building tiny models into %s", paths(cache_dir).policy.parent)
        build_models(cache_dir, cfg, threads)
    return paths(cache_dir)
