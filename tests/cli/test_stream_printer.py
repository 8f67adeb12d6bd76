"""sample.py's StreamPrinter: what it writes, token by token, adds up to the tokenizer's decode of every token, and
nothing it wrote is ever taken back, whether its tokenizer streams bytes (tiktoken) or text (characters)."""
from __future__ import annotations

import io

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sample
from data.tokenizer import CharTokenizer, TiktokenTokenizer

BPE = TiktokenTokenizer("gpt2")
CHARS = CharTokenizer("\nabcé€😀")
# ids 0-255 are GPT-2's single-byte tokens (the bytes of multi-byte characters among them), 50256 its end of text, and a
# model's vocabulary padded to 50304 draws ids past the tokenizer's 50257 (decode reads each as U+FFFD)
BPE_IDS = st.one_of(st.integers(0, 255), st.integers(256, 50255), st.integers(50257, 50303))


def streamed(tokenizer, prompt: list[int], new: list[int], monkeypatch) -> tuple[list[str], str]:
    """(the text written after the prompt and after each pushed token, everything written with the finish)."""
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    printer = sample.StreamPrinter(tokenizer, prompt)
    so_far = [out.getvalue()]
    for token in new:
        printer.push(torch.tensor([token]))
        so_far.append(out.getvalue())
    printer.finish()
    return so_far, out.getvalue()


@settings(max_examples=200, deadline=None)
@given(prompt=st.lists(BPE_IDS, min_size=1, max_size=6), new=st.lists(BPE_IDS, max_size=12))
def test_byte_level_streaming_writes_exactly_the_decoded_text(prompt, new):
    import pytest
    with pytest.MonkeyPatch.context() as monkeypatch:
        so_far, final = streamed(BPE, prompt, new, monkeypatch)
    assert final == BPE.decode(prompt + new) + "\n"
    assert all(final.startswith(text) for text in so_far)  # written once, never taken back
    # a token that completes its characters has them out at once: only an unfinished character waits
    for i, text in enumerate(so_far):
        settled = BPE.decode(prompt + new[:i])
        assert text == settled or (settled.endswith("\ufffd") and settled.startswith(text))


def test_a_character_split_across_tokens_waits_for_its_last_byte(monkeypatch):
    byte_token = {BPE.token_bytes(i): i for i in range(256)}  # GPT-2's 256 single-byte tokens
    pieces = [byte_token[bytes([b])] for b in "😀".encode()]  # four bytes, four tokens
    so_far, final = streamed(BPE, BPE.encode("hi "), pieces, monkeypatch)
    assert so_far == ["hi "] * 4 + ["hi 😀"] and final == "hi 😀\n"


def test_the_end_of_text_stops_the_stream(monkeypatch):
    so_far, final = streamed(BPE, BPE.encode("a"), [*BPE.encode(" b"), BPE.eot, *BPE.encode(" c")], monkeypatch)
    assert final == "a b\n"


@settings(max_examples=100, deadline=None)
@given(prompt=st.lists(st.integers(0, 6), min_size=1, max_size=5), new=st.lists(st.integers(0, 8), max_size=10))
def test_a_character_tokenizer_streams_its_decoded_text_too(prompt, new):
    import pytest
    with pytest.MonkeyPatch.context() as monkeypatch:
        so_far, final = streamed(CHARS, prompt, new, monkeypatch)
    assert final == CHARS.decode(prompt + new) + "\n"
    assert all(final.startswith(text) for text in so_far)
