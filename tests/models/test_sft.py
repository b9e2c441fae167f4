import torch
from transformers import Qwen3ForCausalLM

from pivot.models.config import ArchConfig, qwen3_config
from pivot.models.examples import Example
from pivot.models.sft import SFTConfig, collate, encode_example, train_sft
from pivot.models.tokenizer import train_tokenizer

EXAMPLES = [Example(f"Problem: What is {a} * 0?\nResponse:", " Answer: 0") for a in range(50)]


def tiny():
    tok = train_tokenizer([e.prompt + e.target for e in EXAMPLES], vocab_size=200)
    arch = ArchConfig(hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                      intermediate_size=128)
    torch.manual_seed(0)
    return tok, Qwen3ForCausalLM(qwen3_config(arch, len(tok), tok.bos_token_id,
                                              tok.eos_token_id, tok.pad_token_id))


def test_labels_cover_the_target_and_eos_only():
    tok, _ = tiny()
    enc = [encode_example(tok, EXAMPLES[0]), encode_example(tok, EXAMPLES[11])]
    ids, mask, labels = collate(enc, tok.pad_token_id)
    seq, n_prompt = enc[0]
    assert (labels[0, :n_prompt] == -100).all()
    assert labels[0, len(seq) - 1] == tok.eos_token_id
    assert tok.decode(labels[0][labels[0] >= 0], skip_special_tokens=True) == " Answer: 0"
    assert mask.sum().item() == len(enc[0][0]) + len(enc[1][0])


def test_a_few_steps_of_sft_lower_the_loss():
    tok, model = tiny()
    losses = train_sft(model, tok, EXAMPLES, SFTConfig(steps=30, batch_size=16, lr=1e-2,
                                                       warmup=3))
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5


def test_progress_is_reported_every_fifth_of_the_steps():
    tok, model = tiny()
    seen = []
    train_sft(model, tok, EXAMPLES, SFTConfig(steps=20, batch_size=8, lr=1e-3, warmup=2),
              progress=lambda step, steps, s: seen.append((step, steps)))
    assert seen == [(s, 20) for s in range(4, 21, 4)]
