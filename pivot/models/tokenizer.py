"""The byte-level BPE tokenizers of the two tiny models, trained on the task's own text.

Policy and GenRM each get their own tokenizer (trained on their own SFT text, with their
own vocabulary size and special tokens, so their ids and EOS differ): only text crosses from
rollout to reward, as between two unrelated models on a cluster.

Digits are split one per token before BPE (so numbers are spelled digit by digit, which a
tiny model learns to add far more easily than multi-digit tokens). Wrapped as a Hugging Face
fast tokenizer with bos/eos/pad special tokens; encoding adds bos in front, never eos.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from pivot.data.template import CHAT_TEMPLATE

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
SPECIAL_TOKENS = (PAD, BOS, EOS)  # ids 0, 1, 2
GENRM_SPECIAL_TOKENS = ("<unk>", "<pad>", "<s>", "</s>")  # Llama-style; pad 1, bos 2, eos 3


def train_tokenizer(corpus: Iterable[str], vocab_size: int = 512,
                    model_max_length: int = 1024,
                    specials: tuple[str, ...] = SPECIAL_TOKENS) -> PreTrainedTokenizerFast:
    """Trains the BPE tokenizer on ``corpus`` and wraps it for transformers and vLLM.

    ``specials`` ends with (pad, bos, eos); tokens before them are reserved (an unknown
    token in the GenRM's set).
    """
    pad, bos, eos = specials[-3:]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(specials), min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    bos_id = tok.token_to_id(bos)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, bos_id)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=pad,
        model_max_length=model_max_length, padding_side="left")
    fast.chat_template = CHAT_TEMPLATE
    return fast


@dataclass(frozen=True)
class TextCodec:
    """One model's text <-> token ids (its own tokenizer and EOS).

    Rollout and reward exchange text only: a response is decoded with the policy's codec
    and the GenRM's prompt built from that text is encoded with the GenRM's (sec. 8.1: the
    GenRM is a different model; nothing assumes shared ids).
    """

    encode: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]
    eos_id: int | None
    pad_id: int | None

    @classmethod
    def of(cls, tok) -> "TextCodec":
        return cls(lambda s: tok(s)["input_ids"],
                   lambda ids: tok.decode(ids, skip_special_tokens=True),
                   tok.eos_token_id, tok.pad_token_id)

    @classmethod
    def load(cls, model_dir: str) -> "TextCodec":
        """The codec of the tokenizer saved in ``model_dir``."""
        from transformers import AutoTokenizer
        return cls.of(AutoTokenizer.from_pretrained(model_dir))
