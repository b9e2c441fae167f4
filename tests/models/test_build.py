import os
import subprocess
import sys

import pytest

from pivot.data.dataset import MathTaskConfig
from pivot.models import ArchConfig, BuildConfig, build_models, ensure_models, is_built, paths
from pivot.models.sft import SFTConfig

TINY = BuildConfig(
    task=MathTaskConfig(seed=0, num_val=16),
    arch=ArchConfig(hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                    intermediate_size=128),
    genrm_arch=ArchConfig(family="llama", hidden_size=96, num_layers=2, num_heads=3,
                          num_kv_heads=1, intermediate_size=160, tie_word_embeddings=False),
    vocab_size=300, genrm_vocab_size=320, tokenizer_corpus=200, policy_examples=200,
    genrm_examples=200,
    policy_sft=SFTConfig(steps=3, batch_size=8), genrm_sft=SFTConfig(steps=3, batch_size=8),
    genrm_policy_candidates=50,
    genrm_eval_pairs=16)

LOAD_AND_GENERATE = """
import sys
from transformers import AutoModelForCausalLM, AutoTokenizer
for d in sys.argv[1:]:
    tok = AutoTokenizer.from_pretrained(d)
    m = AutoModelForCausalLM.from_pretrained(d)
    enc = tok(["Problem: What is 1 + 2?\\nResponse:"], return_tensors="pt")
    out = m.generate(**enc, max_new_tokens=4, do_sample=False)
    assert out.shape[1] > enc["input_ids"].shape[1], out.shape
    assert m.config.head_dim in (32, 64) and m.dtype.is_floating_point
print("ok")
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    manifest = build_models(cache, TINY, threads=1)
    return cache, manifest


def test_a_build_writes_both_models_the_tokenizer_and_a_manifest(built):
    cache, manifest = built
    p = paths(cache)
    for d in (p.policy, p.genrm):
        assert (d / "config.json").is_file() and (d / "model.safetensors").is_file()
        assert (d / "tokenizer.json").is_file()
    assert (p.tokenizer / "tokenizer.json").is_file()
    assert manifest["digest"] == TINY.digest() and is_built(cache, TINY)
    res = manifest["results"]
    assert res["genrm"]["params"] > 2 * res["policy"]["params"] > 0
    assert (res["policy"]["architecture"], res["genrm"]["architecture"]) == (
        "Qwen3ForCausalLM", "LlamaForCausalLM")
    assert 0.0 <= res["policy"]["accuracy_at_1"] <= 1.0


def test_ensure_models_reuses_a_matching_build_and_spots_a_stale_one(built):
    cache, _ = built
    weights = paths(cache).policy / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert ensure_models(cache, TINY, threads=1) == paths(cache)
    assert weights.stat().st_mtime_ns == before
    assert not is_built(cache, BuildConfig())  # another config: another digest


def test_the_saved_models_load_offline_and_generate(built):
    cache, _ = built
    p = paths(cache)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", LOAD_AND_GENERATE, str(p.policy), str(p.genrm)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("ok")


def test_the_paths_follow_pivot_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("PIVOT_CACHE", str(tmp_path))
    assert paths().policy == tmp_path / "models" / "policy"


def _digests(cache) -> dict[str, str]:
    import hashlib
    p = paths(cache)
    return {f"{d.name}/{f.name}": hashlib.sha256(f.read_bytes()).hexdigest()
            for d in (p.policy, p.genrm) for f in sorted(d.iterdir()) if f.is_file()}


def test_the_same_config_builds_the_same_weights(built, tmp_path):
    """Reproducible builds: seeded init, data order and SFT on one thread count give
    bit-identical weights, tokenizers and configs (the manifest holds wall times)."""
    cache, manifest = built
    again = build_models(tmp_path, TINY, threads=1)
    assert _digests(tmp_path) == _digests(cache)
    import json

    def measured(man):  # NaN-safe comparison of everything but wall times
        return json.dumps({m: {k: v for k, v in man["results"][m].items()
                               if k != "sft_seconds"} for m in ("policy", "genrm")},
                          sort_keys=True)
    assert measured(again) == measured(manifest)
