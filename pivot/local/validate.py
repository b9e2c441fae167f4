"""Validation accuracy@1 of a policy state dict (sec. 8.6, fig. 15): greedy decoding of the
held-out problems with transformers in the driver process, scored by math-verify."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from pivot.rewards.verifiable import accuracy_at_1
from pivot.rl.data import record_fields


class Validator:
    """Args:
        model_dir: the policy's HF folder (architecture and tokenizer).
        records: validation records (DAPO schema).
        max_new_tokens: greedy generation cap (the group's ``max_response_tokens``).
        batch_size: prompts per generate call.
    """

    def __init__(self, model_dir: str, records: list[dict[str, Any]], max_new_tokens: int,
                 batch_size: int = 32):
        from transformers import AutoTokenizer, Qwen3ForCausalLM

        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.tok.padding_side = "left"
        self.model = Qwen3ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.fields = [record_fields(r) for r in records]
        self.max_new, self.bs = max_new_tokens, batch_size

    @torch.no_grad()
    def accuracy(self, state: Mapping[str, torch.Tensor]) -> float:
        self.model.load_state_dict(dict(state), strict=False)
        self.model.tie_weights()
        outs: list[str] = []
        for i in range(0, len(self.fields), self.bs):
            prompts = [f[0] for f in self.fields[i:i + self.bs]]
            enc = self.tok(prompts, return_tensors="pt", padding=True)
            gen = self.model.generate(**enc, max_new_tokens=self.max_new, do_sample=False,
                                      pad_token_id=self.tok.pad_token_id)
            outs += self.tok.batch_decode(gen[:, enc["input_ids"].shape[1]:],
                                          skip_special_tokens=True)
        return accuracy_at_1(outs, [f[2] for f in self.fields])
