"""Validation accuracy@1 of a policy state dict (sec. 8.6, fig. 15): greedy decoding of the
held-out problems with transformers in the driver process, scored by math-verify. The model
build reports its accuracy with the same function on the same problems and cap
(``pivot.models.build.evaluate_policy``), so the two figures compare."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from pivot.models.evaluate import greedy_generate
from pivot.rewards.verifiable import accuracy_at_1
from pivot.rl.data import record_fields


class Validator:
    """Args:
        model_dir: the policy's HF folder (architecture and tokenizer).
        records: validation records (DAPO schema).
        max_new_tokens: greedy generation cap (the group's ``max_response_tokens``).
        batch_size: prompts per generate call (one call for the default 128: a batch
            waits for its longest response, so fewer calls wait less in all).
    """

    def __init__(self, model_dir: str, records: list[dict[str, Any]], max_new_tokens: int,
                 batch_size: int = 128):
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
        outs = greedy_generate(self.model, self.tok, [f[0] for f in self.fields],
                               self.max_new, self.bs)
        return accuracy_at_1(outs, [f[2] for f in self.fields])
