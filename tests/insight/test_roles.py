"""Head-role scores (insight/roles.py) on maps whose answers are known by hand, the role probe's structure,
the scores of a real model against an independent computation, and the tokenizers' ordinary / start ids
the probe is drawn from."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from data.tokenizer import CharTokenizer, TiktokenTokenizer
from insight.roles import (ROLE_NAMES, ROLE_THRESHOLDS, duplicate_token_score, head_role_scores, induction_score,
                           prev_token_score, probe_length, role_label, role_probe)
from model import GPT, ModelConfig


def uniform_causal(T: int) -> torch.Tensor:
    w = torch.ones(T, T, dtype=torch.float64).tril()
    return w / w.sum(dim=-1, keepdim=True)


def one_key(T: int, key_of_row) -> torch.Tensor:
    """(T, T) map: row i puts all its weight on key key_of_row(i) (clamped to 0..i)."""
    w = torch.zeros(T, T, dtype=torch.float64)
    for i in range(T):
        w[i, min(max(key_of_row(i), 0), i)] = 1.0
    return w


def random_causal(B: int, H: int, T: int, scale: float, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(B, H, T, T, generator=gen, dtype=torch.float64) * scale
    return torch.softmax(scores.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf")), dim=-1)


# --- scores on constructed maps --------------------------------------------------------------------------------

def test_previous_token_scores_on_hand_made_maps():
    T = 12
    heads = torch.stack([one_key(T, lambda i: i - 1), uniform_causal(T), torch.eye(T, dtype=torch.float64),
                         one_key(T, lambda i: 0)])  # (4, T, T): previous token, uniform, self, sink
    expected = [1.0, np.mean([1 / (i + 1) for i in range(1, T)]), 0.0, 1 / (T - 1)]  # sink: only row 1's key 0
    np.testing.assert_allclose(prev_token_score(heads), expected, atol=1e-12)
    half = 0.5 * one_key(T, lambda i: i - 1) + 0.5 * torch.eye(T, dtype=torch.float64)
    assert prev_token_score(half[None])[0] == pytest.approx(0.5)
    assert math.isnan(prev_token_score(torch.ones(2, 1, 1))[0])  # T = 1: no row has a previous token


@pytest.mark.parametrize("R", [1, 2, 3, 5, 50])
def test_duplicate_and_induction_scores_on_hand_made_probe_maps(R):
    T = 1 + 2 * R
    # rows of the second copy (i >= R+1) on the key the role names, the other rows anywhere (here: self)
    duplicate = one_key(T, lambda i: i - R if i > R else i)
    induction = one_key(T, lambda i: i - R + 1 if i > R else i)
    previous = one_key(T, lambda i: i - 1)
    maps = torch.stack([duplicate, induction, previous, uniform_causal(T)])  # (4, T, T)
    second_copy = range(R + 1, 2 * R + 1)
    uniform = np.mean([1 / (i + 1) for i in second_copy])
    dup, ind = duplicate_token_score(maps, R), induction_score(maps, R)
    # at R = 1 the duplicate key i - 1 is the previous token, at R = 2 the induction key i - 1 is: the roles
    # can only be told apart from R = 3 on
    np.testing.assert_allclose(dup, [1, 0, float(R == 1), uniform], atol=1e-12)
    np.testing.assert_allclose(ind, [0, 1, float(R == 2), uniform], atol=1e-12)


def test_probe_scores_only_read_the_second_copy_and_off_by_one_keys_score_zero():
    R = 6
    T = 1 + 2 * R
    early = one_key(T, lambda i: i - R + 1 if i <= R else i)  # "induction" in rows that have no earlier copy
    one_late = one_key(T, lambda i: i - R + 2 if i > R else i)  # one key past the induction key
    one_early = one_key(T, lambda i: i - R - 1 if i > R else i)  # one key before the duplicate
    maps = torch.stack([early, one_late, one_early])
    np.testing.assert_allclose(induction_score(maps, R), 0.0)
    np.testing.assert_allclose(duplicate_token_score(maps, R), 0.0)


def test_probe_maps_too_short_for_R_are_refused():
    with pytest.raises(ValueError, match="1 \\+ 2R positions"):
        induction_score(uniform_causal(10)[None], 5)  # needs 11
    with pytest.raises(ValueError, match="1 \\+ 2R positions"):
        duplicate_token_score(uniform_causal(10)[None], 0)


def loop_scores(w: torch.Tensor, R: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The three scores by explicit loops over batch, heads and rows: the independent computation."""
    B, H, T, _ = w.shape
    prev = [np.mean([w[b, h, i, i - 1].item() for b in range(B) for i in range(1, T)]) for h in range(H)]
    rows = range(R + 1, 2 * R + 1)
    dup = [np.mean([w[b, h, i, i - R].item() for b in range(B) for i in rows]) for h in range(H)]
    ind = [np.mean([w[b, h, i, i - R + 1].item() for b in range(B) for i in rows]) for h in range(H)]
    return np.array(prev), np.array(dup), np.array(ind)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(1, 4), st.integers(1, 8), st.floats(0.0, 10.0), st.integers(0, 2**31 - 1))
def test_scores_on_random_maps_are_in_range_and_equal_a_loop(B, H, R, scale, seed):
    T = 1 + 2 * R
    w = random_causal(B, H, T, scale, seed)
    prev, dup, ind = prev_token_score(w), duplicate_token_score(w, R), induction_score(w, R)
    for got, want in zip((prev, dup, ind), loop_scores(w, R)):
        assert got.shape == (H,) and got.dtype == np.float64
        np.testing.assert_allclose(got, want, atol=1e-12)
        assert ((got >= 0) & (got <= 1 + 1e-12)).all()
    # (n_head, T, T) of one item = that item's (1, n_head, T, T); the batch score is the mean of the items'
    np.testing.assert_allclose(prev_token_score(w[0]), prev_token_score(w[:1]), atol=0)
    np.testing.assert_allclose(induction_score(w, R), np.mean([induction_score(x, R) for x in w], axis=0), atol=1e-12)


def test_scores_take_numpy_and_float32():
    w = random_causal(2, 3, 9, 2.0, 0)
    np.testing.assert_allclose(prev_token_score(w.numpy()), prev_token_score(w), atol=0)
    np.testing.assert_allclose(induction_score(w.float(), 4), induction_score(w, 4), atol=1e-6)


# --- labels ----------------------------------------------------------------------------------------------------

def test_role_label_follows_the_thresholds_in_order():
    t = ROLE_THRESHOLDS
    assert set(t) == set(ROLE_NAMES) and all(v == 0.4 for v in t.values())
    assert role_label(0.0, 0.0, 0.0) == ""
    assert role_label(0.9, 0.0, 0.0) == "previous-token"
    assert role_label(0.0, 0.9, 0.0) == "duplicate-token"
    assert role_label(0.0, 0.0, 0.9) == "induction"
    assert role_label(0.9, 0.9, 0.9) == "induction"  # the most specific role wins
    assert role_label(0.9, 0.9, 0.0) == "previous-token"
    # strictly above the threshold: exactly 0.4 is not enough, the next float up is
    assert role_label(t["prev_token"], t["duplicate_token"], t["induction"]) == ""
    assert role_label(0.0, 0.0, np.nextafter(t["induction"], 1.0)) == "induction"
    assert role_label(math.nan, math.nan, math.nan) == ""
    assert role_label(np.float64(0.5), np.float32(0.1), np.float64(0.2)) == "previous-token"


# --- the role probe --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("block_size,R", [(3, 1), (4, 1), (5, 2), (24, 11), (100, 49), (101, 50), (102, 50),
                                          (256, 50), (1024, 50)])
def test_probe_length(block_size, R):
    assert probe_length(block_size) == R
    assert 1 + 2 * R <= block_size


@pytest.mark.parametrize("block_size", [3, 4, 24, 101, 256, 1024])
@pytest.mark.parametrize("batch", [1, 8])
def test_role_probe_is_a_start_token_and_two_equal_copies_of_ordinary_ids(block_size, batch):
    ordinary = np.arange(3, 400)
    probe = role_probe(ordinary, start_id=0, block_size=block_size, batch=batch, seed=5)
    R = probe_length(block_size)
    assert probe.dtype == torch.long and probe.shape == (batch, 1 + 2 * R)
    assert (probe[:, 0] == 0).all()
    assert torch.equal(probe[:, 1:R + 1], probe[:, R + 1:])
    assert np.isin(probe[:, 1:].numpy(), ordinary).all()
    for row in probe:  # enough ids: no token twice within a copy, so i - R is the one earlier occurrence
        assert len(set(row[1:R + 1].tolist())) == R
    if batch > 1 and R > 1:
        assert not torch.equal(probe[0], probe[1])  # each sequence drawn afresh


def test_role_probe_is_seeded_and_ignores_the_global_rng():
    ordinary = list(range(50257))
    torch.manual_seed(1)
    np.random.seed(1)
    a = role_probe(ordinary, 50256, 256, seed=0)
    torch.manual_seed(2)
    np.random.seed(2)
    torch.rand(10)
    b = role_probe(ordinary, 50256, 256, seed=0)
    assert torch.equal(a, b)
    assert not torch.equal(a, role_probe(ordinary, 50256, 256, seed=1))
    assert torch.equal(role_probe(np.array(ordinary), 50256, 256), role_probe(torch.tensor(ordinary), 50256, 256))


def test_role_probe_leaves_out_the_start_token_when_it_can_and_repeats_when_it_must():
    probe = role_probe(range(60), start_id=0, block_size=101, batch=4)  # R = 50 < 59 ids besides 0
    assert not (probe[:, 1:] == 0).any()
    few = role_probe([7, 8, 9], start_id=7, block_size=24, batch=3)  # R = 11 > 3 ids: drawn with replacement
    assert np.isin(few[:, 1:].numpy(), [7, 8, 9]).all() and torch.equal(few[:, 1:12], few[:, 12:])
    assert set(few[:, 1:].unique().tolist()) == {7, 8, 9}  # start kept in the pool: too few ids without it


def test_role_probe_refuses_what_cannot_be_a_probe():
    with pytest.raises(ValueError, match="at least 3 positions"):
        role_probe(range(10), 0, block_size=2)
    with pytest.raises(ValueError, match="one ordinary token id"):
        role_probe([], 0, block_size=10)
    with pytest.raises(ValueError, match="batch=0"):
        role_probe(range(10), 0, block_size=10, batch=0)


# --- a real model ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("attn_impl,budget", [("manual", None), ("sdpa", None), ("manual", 1)])
def test_head_role_scores_equal_the_scores_of_the_models_maps(attn_impl, budget, monkeypatch):
    if budget is not None:  # one sequence per pass instead of all at once: the same means
        monkeypatch.setattr("insight.roles.MAPS_BUDGET_BYTES", budget)
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=40, block_size=24, n_layer=3, n_head=4, n_kv_head=2, d_model=32,
                            pos="rope", norm="rmsnorm", mlp="swiglu", dropout=0.3, attn_impl=attn_impl))
    model.train()
    text = torch.randint(0, 40, (3, 24))
    probe = role_probe(range(1, 40), start_id=0, block_size=24, batch=4)  # R = 11: (4, 23)
    scores = head_role_scores(model, text, probe)
    assert model.training  # restored
    assert list(scores) == list(ROLE_NAMES)
    model.eval()
    text_maps, probe_maps = model.attention_maps(text), model.attention_maps(probe)
    for layer in range(3):
        expected = (prev_token_score(text_maps[layer]), duplicate_token_score(probe_maps[layer], 11),
                    induction_score(probe_maps[layer], 11))
        for name, want in zip(ROLE_NAMES, expected):
            assert scores[name].shape == (3, 4) and scores[name].dtype == np.float64
            np.testing.assert_allclose(scores[name][layer], want, atol=1e-6)
    with pytest.raises(ValueError, match="text_idx must be"):
        head_role_scores(model, text[:0], probe)
    with pytest.raises(ValueError, match="probe_idx must be"):
        head_role_scores(model, text, probe[0])


# --- ordinary ids and start ids of the tokenizers ---------------------------------------------------------------

def test_gpt2_ordinary_ids_are_every_token_but_endoftext_and_it_starts_sequences():
    tok = TiktokenTokenizer("gpt2")
    ordinary = tok.ordinary_ids()
    assert ordinary.dtype == np.int64 and np.array_equal(ordinary, np.arange(50256))
    assert tok.start_id == tok.eot == 50256


def test_tiktoken_ordinary_ids_skip_specials_and_unassigned_ids():
    import tiktoken
    enc = tiktoken.Encoding("toy", pat_str=r"\S+|\s+", mergeable_ranks={bytes([b]): b for b in range(256)},
                            special_tokens={"<|endoftext|>": 258, "<|other|>": 260})  # 256, 257, 259 unassigned
    tok = TiktokenTokenizer.__new__(TiktokenTokenizer)
    tok.name, tok._enc = "toy", enc
    assert tok.vocab_size == 261
    assert np.array_equal(tok.ordinary_ids(), np.arange(256))
    assert tok.start_id == 258


def test_char_tokenizer_ordinary_ids_are_all_ids_and_it_starts_at_the_newline():
    tok = CharTokenizer.from_text("To be,\nor not")
    assert np.array_equal(tok.ordinary_ids(), np.arange(tok.vocab_size))
    assert tok.token_strings([tok.start_id]) == ["\n"] and tok.prompt_ids("") == [tok.start_id]
    assert CharTokenizer("xyz").start_id == 0  # no newline in the corpus: the first id


def test_hf_tokenizer_ordinary_ids_leave_out_special_tokens_and_start_at_bos():
    pytest.importorskip("tokenizers", reason="the hf extra (tokenizers) is not installed")
    from data.tokenizer import HFTokenizer
    from tests.hf_models import llama_tokenizer_json
    data = llama_tokenizer_json().encode()
    tok = HFTokenizer(data, eot=2, bos=1)
    ordinary = tok.ordinary_ids()
    assert np.array_equal(ordinary, np.arange(3, tok.vocab_size))  # <unk> <s> </s> are ids 0 1 2
    assert tok.start_id == 1
    assert HFTokenizer(data, eot=2).start_id == 2  # no BOS: the end-of-sequence token
    assert HFTokenizer(data).start_id == 3  # neither: the first ordinary id
