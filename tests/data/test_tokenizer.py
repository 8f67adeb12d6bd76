"""data/tokenizer.py: the char and tiktoken tokenizers, their JSON descriptions and their errors (DataConfig:
test_config.py; the split/cut rules of data/splitting.py: test_splitting.py)."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import UserError
from data.tokenizer import CharTokenizer, TiktokenTokenizer, tokenizer_from_json


def _gpt2_or_skip() -> TiktokenTokenizer:
    try:
        return TiktokenTokenizer("gpt2")
    except UserError as e:
        pytest.skip(f"GPT-2 vocabulary not available offline: {e}")


@pytest.fixture(scope="module")
def gpt2() -> TiktokenTokenizer:
    return _gpt2_or_skip()


# --- char -------------------------------------------------------------------------------------------------

def test_char_round_trip_and_sorted_vocab() -> None:
    text = "First Citizen:\nBefore we proceed any further, hear me speak.\n"
    tok = CharTokenizer.from_text(text)
    assert tok.chars == "".join(sorted(set(text)))
    assert tok.vocab_size == len(set(text))
    ids = tok.encode(text)
    assert ids == [tok.chars.index(c) for c in text]
    assert tok.decode(ids) == text
    assert tok.eot is None
    assert tok.encode("") == [] and tok.decode([]) == ""


def test_char_unknown_characters_are_named() -> None:
    tok = CharTokenizer.from_text("hello world")
    assert tok.unknown_chars("héllo wörld é") == ["é", "ö"]
    assert tok.unknown_chars("hello") == []
    with pytest.raises(UserError, match="'é', 'ö'"):
        tok.encode("héllo wörld")


def test_char_json_round_trip_is_exact() -> None:
    tok = CharTokenizer.from_text("zebra\tquartz ✓ \U0001F600\n")
    spec = json.loads(json.dumps(tok.to_json()))
    again = tokenizer_from_json(spec)
    assert isinstance(again, CharTokenizer)
    assert again.chars == tok.chars
    assert again.encode("zebra ✓\U0001F600") == tok.encode("zebra ✓\U0001F600")


def test_char_labels_decode_of_unknown_ids_and_prompt() -> None:
    tok = CharTokenizer.from_text("ab \n")
    assert tok.token_strings(tok.encode("a b\n")) == ["a", " ", "b", "\n"]  # each token's own text
    assert tok.decode([0, 999]) == tok.chars[0] + "\ufffd"
    assert tok.prompt_ids("") == tok.encode("\n")
    assert tok.prompt_ids("ab") == tok.encode("ab")


# --- tiktoken ---------------------------------------------------------------------------------------------

def test_gpt2_known_ids(gpt2: TiktokenTokenizer) -> None:
    assert gpt2.encode("hello world") == [31373, 995]
    assert gpt2.decode([31373, 995]) == "hello world"
    assert gpt2.vocab_size == 50257
    assert gpt2.eot == 50256
    assert gpt2.encode("<|endoftext|>") != [gpt2.eot]  # corpus text cannot inject a separator


@settings(max_examples=200, deadline=None)
@given(text=st.text())
def test_gpt2_round_trips_any_unicode(text: str) -> None:
    tok = _gpt2_or_skip()
    assert tok.decode(tok.encode(text)) == text


def test_gpt2_labels_one_per_token(gpt2: TiktokenTokenizer) -> None:
    assert gpt2.token_strings(gpt2.encode("hello world\n")) == ["hello", " world", "\n"]
    emoji_ids = gpt2.encode("\U0001F600")
    labels = gpt2.token_strings(emoji_ids)
    assert len(labels) == len(emoji_ids) and all(labels)
    assert gpt2.token_strings([50300]) == ["<50300>"]


def test_gpt2_out_of_vocab_ids_decode_to_replacement(gpt2: TiktokenTokenizer) -> None:
    # a model with a padded embedding (50304 rows) can sample ids past the vocabulary
    assert gpt2.decode([31373, 50300, 995]) == "hello\ufffd world"


def test_gpt2_prompt_never_empty(gpt2: TiktokenTokenizer) -> None:
    assert gpt2.prompt_ids("") == [gpt2.eot]
    assert gpt2.prompt_ids("hello") == [31373]


def test_gpt2_json_round_trip(gpt2: TiktokenTokenizer) -> None:
    again = tokenizer_from_json(json.loads(json.dumps(gpt2.to_json())))
    assert isinstance(again, TiktokenTokenizer) and again.name == "gpt2"
    assert again.encode("attention is all") == gpt2.encode("attention is all")
    with pytest.raises(UserError, match="50000"):
        tokenizer_from_json({"kind": "tiktoken", "encoding": "gpt2", "vocab_size": 50000})


@pytest.mark.parametrize("spec", [None, {}, {"kind": "sentencepiece"}, {"kind": "char", "chars": "aa"},
                                  {"kind": "char", "chars": 5}, {"kind": "tiktoken"}])
def test_corrupt_tokenizer_json_is_a_user_error(spec: object) -> None:
    with pytest.raises(UserError, match="prepare"):
        tokenizer_from_json(spec)


def test_unknown_tiktoken_name_suggests_closest() -> None:
    with pytest.raises(UserError, match="did you mean 'gpt2'"):
        TiktokenTokenizer("gtp2")


def test_undownloadable_encoding_is_told_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    import tiktoken

    def offline(name: str) -> None:
        raise ConnectionError("Failed to resolve 'openaipublic.blob.core.windows.net'")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    with pytest.raises(UserError, match="cannot load tiktoken encoding 'cl100k_base'.*TIKTOKEN_CACHE_DIR"):
        TiktokenTokenizer("cl100k_base")
