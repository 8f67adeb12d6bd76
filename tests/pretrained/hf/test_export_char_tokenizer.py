"""A char model exported with convert.py to-hf carries a tokenizer Hugging Face reads: transformers' AutoTokenizer
loads the folder offline, encodes texts of the vocabulary's characters (spaces, newlines, punctuation) to
CharTokenizer's own ids and decodes them back to the text, and AutoModelForCausalLM on those ids gives attngpt's
logits; attngpt reading the folder back still picks its char tokenizer (attngpt_char_vocab.json)."""
from __future__ import annotations

import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import fresh_copy, prepared_shakespeare_dir
from tests.hf_models import transformers_or_skip

transformers = transformers_or_skip()

from data.tokenizer import CharTokenizer  # noqa: E402
from pretrained.convert import to_hf  # noqa: E402
from pretrained.load import open_pretrained  # noqa: E402
from tests.pretrained.test_convert import TOLERANCE  # noqa: E402

FIXED_TEXTS = ["", " ", "\n", "\n\n  ", "ROMEO:\nBut, soft! what light through yonder window breaks?\n\n",
               "  a  ,b .c ' d - e ; f ? ", "I'll ne'er -- 'tis done.\n"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return prepared_shakespeare_dir(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    """The tiny char run trained 2 steps (conftest.py: a Llama-layout model) and its to-hf folder."""
    root = tmp_path_factory.mktemp("char_export")
    run, _ = fresh_copy(trained, root)
    out, arch = to_hf(str(run), root / "hf")
    assert arch == "LlamaForCausalLM"
    source = open_pretrained(str(run))
    return (out, source.tokenizer, source.build().eval(), transformers.AutoTokenizer.from_pretrained(out),
            transformers.AutoModelForCausalLM.from_pretrained(out).eval())


def texts(chars: str):
    return st.text(alphabet=st.sampled_from(chars), max_size=40)


def test_the_folder_holds_tokenizer_files_both_sides_read(exported):
    out, tok, _, theirs, _ = exported
    assert isinstance(tok, CharTokenizer) and "\n" in tok.chars and " " in tok.chars
    names = {p.name for p in out.iterdir()}
    assert {"attngpt_char_vocab.json", "tokenizer.json", "tokenizer_config.json", "config.json",
            "generation_config.json", "model.safetensors"} <= names
    assert json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert len(theirs) == tok.vocab_size and theirs.get_vocab() == {c: i for i, c in enumerate(tok.chars)}
    # attngpt reads the folder back with its own char tokenizer, tokenizer.json notwithstanding
    back = open_pretrained(str(out)).tokenizer
    assert isinstance(back, CharTokenizer) and back.chars == tok.chars


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_auto_tokenizer_round_trips_with_char_tokenizer_ids(exported, data):
    _, tok, _, theirs, _ = exported
    text = data.draw(st.one_of(st.sampled_from(FIXED_TEXTS), texts(tok.chars)))
    ids = theirs.encode(text)
    assert ids == tok.encode(text) == theirs(text)["input_ids"]
    assert theirs.decode(ids) == text


@settings(max_examples=10, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_transformers_logits_on_the_tokenizer_ids_equal_attngpt(exported, data):
    _, tok, model, theirs, hf_model = exported
    text = data.draw(texts(tok.chars)) + "\n"
    idx = torch.tensor([theirs.encode(text)[-model.config.block_size:]])
    with torch.no_grad():
        diff = (model(idx)[0] - hf_model(idx).logits).abs().max().item()
    assert diff <= TOLERANCE, diff


def test_a_character_outside_the_vocabulary_is_refused_not_silently_mapped(exported):
    _, tok, _, theirs, _ = exported
    missing = next(chr(c) for c in range(0x100, 0x200) if chr(c) not in tok.chars)
    with pytest.raises(Exception, match="UNK"):
        theirs.encode("a" + missing)

