"""HFTokenizer (a Hugging Face tokenizer.json behind attngpt's tokenizer interface) and how it is stored:
a sidecar tokenizer.json whose sha256 the JSON description records."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("tokenizers", reason="the hf extra (tokenizers) is not installed")

from common.errors import UserError  # noqa: E402
from data.tokenizer import HFTokenizer, stored_tokenizer, tokenizer_from_json  # noqa: E402
from tests.hf_models import LLAMA_TEXT, llama_tokenizer_json  # noqa: E402

TEXT = "The animal didn't cross the street because it was tired. naïve ½ <s> </s>\n"


@pytest.fixture(scope="module")
def llama_style() -> HFTokenizer:
    return HFTokenizer(llama_tokenizer_json().encode(), eot=2, bos=1, name="llama-style")


@pytest.fixture(scope="module")
def byte_level() -> HFTokenizer:
    """A GPT-2 / Llama-3 style byte-level BPE."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(LLAMA_TEXT, trainers.BpeTrainer(vocab_size=400, special_tokens=["<|end|>"],
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                           show_progress=False))
    return HFTokenizer(tk.to_str().encode(), eot=0, name="byte-level")


def test_text_round_trips_and_special_token_text_stays_text(llama_style, byte_level):
    for tok in (llama_style, byte_level):
        ids = tok.encode(TEXT)
        assert tok.decode(ids) == TEXT
        assert tok.eot not in ids and (tok.bos is None or tok.bos not in ids)  # "<s>" in a text is not <s>
        assert tok.encode_batch([TEXT, "x"]) == [ids, tok.encode("x")]


def test_prompt_ids_follow_the_tokenizers_template(llama_style, byte_level):
    assert llama_style.prompt_ids("it was") == [1, *llama_style.encode("it was")]
    assert llama_style.prompt_ids("") == [1]
    assert byte_level.prompt_ids("it was") == byte_level.encode("it was")  # no template: nothing added
    assert byte_level.prompt_ids("") == [byte_level.eot]


def test_token_labels_are_the_text_each_token_stands_for(llama_style, byte_level):
    for tok in (llama_style, byte_level):
        labels = tok.token_strings(tok.encode("the animal was tired"))
        assert "".join(labels).strip() == "the animal was tired" and " animal" in labels, labels
    # "½" is not in the vocabulary: byte fallback gives its two UTF-8 bytes, after the word-start marker
    assert llama_style.token_strings(llama_style.encode("½")) == [" ", "\\xc2", "\\xbd"]
    assert llama_style.token_strings([1, 999999]) == ["<s>", "<999999>"]


def test_ids_outside_the_vocabulary_decode_to_the_replacement_character(llama_style):
    ids = llama_style.encode("it was")
    assert llama_style.decode([*ids, llama_style.vocab_size + 5]) == "it was\ufffd"


def test_stored_as_a_sidecar_whose_hash_is_checked(llama_style, tmp_path):
    spec, files = stored_tokenizer(llama_style)
    assert spec["file"] == "tokenizer.json" and set(files) == {"tokenizer.json"}
    assert len(json.dumps(spec)) < 400  # the description stays small; the 2-9 MB of a real one sit beside it
    (tmp_path / "tokenizer.json").write_bytes(files["tokenizer.json"])
    again = tokenizer_from_json(spec, base_dir=tmp_path)
    assert again.encode(TEXT) == llama_style.encode(TEXT) and (again.eot, again.bos) == (2, 1)
    # in memory, the description names the absolute file (what datasets.map workers rebuild it from)
    assert tokenizer_from_json(again.to_json()).encode(TEXT) == llama_style.encode(TEXT)
    (tmp_path / "tokenizer.json").write_bytes(files["tokenizer.json"].replace(b"animal", b"anima1"))
    with pytest.raises(UserError, match="is not the one its description records .sha256 differs.; fix it"):
        tokenizer_from_json(spec, remedy="fix it", base_dir=tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    with pytest.raises(UserError, match="cannot read the tokenizer file"):
        tokenizer_from_json(spec, base_dir=tmp_path)


def test_a_broken_tokenizer_json_is_one_clear_error():
    with pytest.raises(UserError, match="cannot be read by the tokenizers library"):
        HFTokenizer(b'{"model": {"type": "Nonsense", "vocab": {}}}')
    with pytest.raises(UserError, match=r"model.vocab is missing, expected an object .*the file is damaged"):
        HFTokenizer(b'{"model": {"type": "BPE"}}')  # checked before the library sees it
    with pytest.raises(UserError, match="eot id 5000 is outside the tokenizer's"):
        HFTokenizer(llama_tokenizer_json().encode(), eot=5000)


def test_gpt2s_tiktoken_encoding_stands_in_only_when_vocabulary_and_merges_are_gpt2s(tmp_path):
    """vocab.json + merges.txt equal to GPT-2's: attngpt's tiktoken "gpt2" encoding (the same ids, faster).
    The same vocabulary with two merges swapped tokenizes differently, so it is not GPT-2's."""
    from data.hf_tokenizer import tokenizer_for_hf_folder
    from data.tokenizer import TiktokenTokenizer
    from tests.hf_models import gpt2_tokenizer_dir
    try:
        folder = gpt2_tokenizer_dir(tmp_path / "gpt2")
    except UserError as e:
        pytest.skip(f"the GPT-2 vocabulary is not cached on this machine ({e})")
    config = {"vocab_size": 50257}
    assert isinstance(tokenizer_for_hf_folder(folder, config, "gpt2", name="gpt2"), TiktokenTokenizer)
    lines = (folder / "merges.txt").read_text(encoding="utf-8").split("\n")
    lines[1], lines[2] = lines[2], lines[1]
    (folder / "merges.txt").write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(UserError, match=r"no tokenizer.json in .* \(its vocab.json / merges.txt are not GPT-2's"):
        tokenizer_for_hf_folder(folder, config, "gpt2", name="gpt2")
