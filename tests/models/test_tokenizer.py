from pivot.data.template import format_response, render_prompt
from pivot.models.tokenizer import BOS, EOS, PAD, train_tokenizer

CORPUS = [render_prompt([{"role": "user", "content": f"Problem: What is {a} + {b}?"}])
          + format_response(a + b) for a in range(30) for b in range(10)]


def test_the_tokenizer_round_trips_text_and_adds_only_bos():
    tok = train_tokenizer(CORPUS, vocab_size=300)
    text = CORPUS[17]
    ids = tok(text).input_ids
    assert ids[0] == tok.bos_token_id and tok.eos_token_id not in ids
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert (tok.pad_token, tok.bos_token, tok.eos_token) == (PAD, BOS, EOS)
    assert tok.pad_token_id != tok.eos_token_id


def test_numbers_are_spelled_one_digit_per_token():
    tok = train_tokenizer(CORPUS, vocab_size=300)
    pieces = tok.convert_ids_to_tokens(tok(" 1234", add_special_tokens=False).input_ids)
    assert [p for p in pieces if p.strip("Ġ")] == ["1", "2", "3", "4"]


def test_the_chat_template_renders_the_same_prompt_text():
    tok = train_tokenizer(CORPUS, vocab_size=300)
    msgs = [{"role": "user", "content": "Problem: What is 1 + 2?"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == BOS + render_prompt(msgs)


def test_two_models_own_tokenizers_exchange_text_not_ids():
    from pivot.models.tokenizer import GENRM_SPECIAL_TOKENS, TextCodec
    policy = TextCodec.of(train_tokenizer(CORPUS, vocab_size=300))
    judge_corpus = [c + "\n= 7 ok\nGiven: 7\nScore: 10" for c in CORPUS]
    genrm = TextCodec.of(train_tokenizer(judge_corpus, vocab_size=330,
                                         specials=GENRM_SPECIAL_TOKENS))
    assert policy.eos_id != genrm.eos_id and policy.pad_id != genrm.pad_id
    text = " 23 + 7 = 30\nAnswer: 30"
    ids = policy.encode(text)
    assert genrm.encode(text) != ids                 # different vocabularies
    assert genrm.decode(genrm.encode(policy.decode(ids))) == text
