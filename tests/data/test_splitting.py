"""data/splitting.py: nanoGPT's split point of a continuous text, every k-th document to val (exactly, and by index
alone), a piece split at a character, rows grouped into pieces that reassemble the text, and cuts that leave
GPT-2's BPE tokens unchanged (hypothesis)."""
from __future__ import annotations

from io import StringIO

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from data.splitting import (group_rows, split_piece, text_split_point, val_document_count, val_document_mask)
from tests.data.test_tokenizer import _gpt2_or_skip


def test_text_split_point_is_nanogpts() -> None:
    assert text_split_point(1115394, 0.1) == int(1115394 * 0.9) == 1003854


def test_document_split_is_every_kth_and_exact() -> None:
    idx = np.arange(100)
    assert np.flatnonzero(val_document_mask(idx, 0.1)).tolist() == [9, 19, 29, 39, 49, 59, 69, 79, 89, 99]
    for f in (0.05, 0.1, 0.25, 1 / 3, 0.5):
        for n in (1, 7, 30, 1000):
            assert int(val_document_mask(np.arange(n), f).sum()) == val_document_count(n, f)
    # a document's side depends on its index only (streaming batches agree with one big batch)
    assert val_document_mask(np.arange(50, 60), 0.1).tolist() == val_document_mask(idx, 0.1)[50:60].tolist()


def test_split_piece_straddling_and_outside() -> None:
    assert split_piece("abcdef", 10, 13) == ("abc", "def")
    assert split_piece("abcdef", 10, 5) == ("", "abcdef")
    assert split_piece("abcdef", 10, 99) == ("abcdef", "")


def test_group_rows_reassembles_and_tracks_offsets() -> None:
    rows = [f"line {i}.\n" for i in range(100)]
    pieces = list(group_rows(rows, target_chars=50))
    assert len(pieces) > 5
    assert "".join(p.text for p in pieces) == "".join(rows)
    for p in pieces:
        assert p.text == "".join(rows[p.start_row:p.stop_row])
        assert p.start_char == len("".join(rows[:p.start_row]))


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list("ab Z1.'\n\n\t  ,-é\U0001F600s/")), max_size=300),
       target=st.integers(1, 30))
def test_safe_cuts_do_not_change_bpe_tokens(text: str, target: int) -> None:
    tok = _gpt2_or_skip()
    rows = StringIO(text, newline="").readlines()
    pieces = list(group_rows(rows, target_chars=target, max_chars=10**9))
    assert [i for p in pieces for i in tok.encode(p.text)] == tok.encode(text)
