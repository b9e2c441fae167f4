"""The shared byte-level BPE tokenizer, trained on the task's own text.

Digits are split one per token before BPE (so numbers are spelled digit by digit, which a
tiny model learns to add far more easily than multi-digit tokens). Wrapped as a Hugging Face
fast tokenizer with bos/eos/pad special tokens; encoding adds bos in front, never eos.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from pivot.data.template import CHAT_TEMPLATE

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
SPECIAL_TOKENS = [PAD, BOS, EOS]  # ids 0, 1, 2


def train_tokenizer(corpus: Iterable[str], vocab_size: int = 512,
                    model_max_length: int = 1024) -> PreTrainedTokenizerFast:
    """Trains the BPE tokenizer on ``corpus`` and wraps it for transformers and vLLM."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, bos_id)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
        model_max_length=model_max_length, padding_side="left")
    fast.chat_template = CHAT_TEMPLATE
    return fast
