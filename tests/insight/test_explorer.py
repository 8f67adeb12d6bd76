"""insight/explorer/, what the explorer is built from, checked without a browser: GPT.attention_internals against
the layer it describes, the byte budget, and the page's data decoded in Python (tests/insight/test_explorer_browser.py
and insight/test_explorer_text_view.py drive the page itself; value-weighted attention against a float64 loop:
insight/test_value_weighted.py; the 8-bit packing and the choice of detail heads: insight/explorer/test_pack.py)."""
from __future__ import annotations

import base64
import gzip
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from insight.dump import dump_internals
from insight.explorer import ExplorerOptions, HeadScores, explorer_html
from insight.explorer.pack import dequantise_rows
from insight.stats import head_stats
from insight.value_weighted import value_norms, value_weighted
from model import GPT, ModelConfig

REPO = Path(__file__).resolve().parents[2]
ARCHS = {
    "mha": dict(n_kv_head=4, pos="learned", norm="layernorm", mlp="gelu", bias=True, attn_impl="sdpa"),
    "gqa": dict(n_kv_head=2),  # RoPE, RMSNorm, SwiGLU
    "mqa": dict(n_kv_head=1, attn_impl="sdpa"),
}


def lively_model(seed: int = 0, **overrides) -> GPT:
    """A random GPT whose matrices have std 0.3, so its attention is far from uniform (eval mode)."""
    torch.manual_seed(seed)
    config = dict(vocab_size=31, block_size=32, n_layer=2, n_head=4, d_model=32, pos="rope", norm="rmsnorm",
                  mlp="swiglu", attn_impl="manual")
    model = GPT(ModelConfig(**{**config, **overrides}))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    return model.eval()


def ids(T: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 31, (1, T), generator=torch.Generator().manual_seed(seed))


def page_data(html: str) -> tuple[dict, bytes, bytes]:
    """The page's JSON header and its two blobs, decoded as the page does."""
    def script(name):
        return re.search(rf'<script type="[^"]+" id="{name}">(.*?)</script>', html, re.S).group(1)
    meta = json.loads(script("attn-meta"))
    blobs = [gzip.decompress(base64.b64decode(script(n))) if script(n).strip() else b""
             for n in ("attn-data", "attn-detail")]
    return meta, blobs[0], blobs[1]


def array(blob: bytes, spec) -> np.ndarray:
    offset, dtype, shape = spec
    return np.frombuffer(blob, dtype=np.dtype(dtype).newbyteorder("<"), count=int(np.prod(shape)),
                         offset=offset).reshape(shape)


# --- the model's side: attention_internals -----------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHS)
def test_internals_redo_the_layer(arch):
    """From q, k, v and W_O alone: the softmax of q.k/sqrt(d) under the causal mask (float64) gives the
    model's weights, and sum_h W_O^h sum_j alpha_ij v_j + bias gives the attention layer's own output
    (captured by a hook of the test). So q and k carry RoPE exactly as the model applied it."""
    model = lively_model(seed=3, **ARCHS[arch])
    idx = ids(20)
    outputs = {}
    handles = [block.attn.register_forward_hook(lambda m, a, out, layer=layer: outputs.__setitem__(layer, out[0]))
               for layer, block in enumerate(model.blocks)]
    internals = model.attention_internals(idx)
    for h in handles:
        h.remove()
    maps = model.attention_maps(idx)
    n_head, n_kv, T, D = 4, ARCHS[arch]["n_kv_head"], 20, 8
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    for layer, it in internals.items():
        assert it.q.shape == (1, n_head, T, D) and it.k.shape == it.v.shape == (1, n_kv, T, D)
        k = it.k.double().repeat_interleave(n_head // n_kv, dim=1)
        v = it.v.double().repeat_interleave(n_head // n_kv, dim=1)
        scores = (it.q.double() @ k.transpose(-1, -2) / math.sqrt(D)).masked_fill(future, float("-inf"))
        alpha = torch.softmax(scores, dim=-1)
        torch.testing.assert_close(alpha, it.weights.double(), atol=1e-6, rtol=0)
        torch.testing.assert_close(it.weights, maps[layer], atol=0, rtol=0)
        heads_out = alpha @ v  # (1, n_head, T, D)
        y = sum(heads_out[:, h] @ it.out_weight.double()[:, h * D:(h + 1) * D].T for h in range(n_head))
        if it.out_bias is not None:
            y = y + it.out_bias.double()
        torch.testing.assert_close(y, outputs[layer].double(), atol=1e-5, rtol=1e-5)
        assert float(alpha.std()) > 0.05  # far from uniform: the checks above could not pass by accident
    with pytest.raises(ValueError, match="out of range"):
        model.attention_internals(idx, layers=[2])
    assert all(not block.attn._forward_hooks for block in model.blocks)  # the hooks are gone


def test_internals_leave_training_mode_as_it_was():
    model = lively_model().train()
    model.attention_internals(ids(5), layers=[1])
    assert model.training


# --- the page's data -------------------------------------------------------------------------------

def test_page_holds_the_model_numbers_and_nothing_remote(tmp_path):
    model = lively_model(seed=5, n_kv_head=2)
    idx = ids(24)
    internals = model.attention_internals(idx)
    tokens = [f"<t{i}>" for i in idx[0].tolist()]
    html = explorer_html(internals, tokens, {0: [0, 1, 2, 3], 1: [2]},
                         options=ExplorerOptions(title="a </script> title"))
    # self-contained: no address is loaded, a policy forbids any, and no tag is broken by a token
    assert 'http-equiv="Content-Security-Policy" content="default-src \'none\'' in html
    assert re.findall(r"https?://[^\s\"'<>]+", html) == ["http://www.w3.org/2000/svg"]  # a namespace name, not loaded
    for remote in ("src=", "href=", "url(", "@import", "fetch(", "XMLHttpRequest", "import(", "<link", "<iframe"):
        assert remote not in html, remote
    assert html.count("</script>") == 4 and "<t" not in html.split('id="attn-meta">')[1].split("</script>")[0]
    meta, data, detail = page_data(html)
    assert (meta["window"], meta["n_tokens"], meta["n_head"], meta["n_kv_head"], meta["head_dim"]) == (24, 24, 4, 2, 8)
    assert meta["labels"] == tokens and meta["selected"] == {"0": [0, 1, 2, 3], "1": [2]}
    for layer, it in internals.items():
        w = it.weights[0].numpy()
        codes, row_max = array(data, meta["arrays"][f"attn.{layer}"]), array(data, meta["arrays"][f"scale.{layer}"])
        assert (np.abs(dequantise_rows(codes, row_max) - w) <= row_max[..., None] / 510 * (1 + 1e-5)).all()
        np.testing.assert_array_equal(array(data, meta["arrays"][f"vnorm.{layer}"]),
                                      value_norms(it.v, it.out_weight, 4)[0].numpy())
        stats = head_stats(w)
        for name, values in meta["stats"][str(layer)].items():
            np.testing.assert_allclose(np.array(values, dtype=float), stats[name], rtol=1e-12)
    # small enough for every head's q, k, v: exact float32
    assert meta["detail_heads"] == {"0": [0, 1, 2, 3], "1": [2, 0, 1, 3]}
    np.testing.assert_array_equal(array(detail, meta["detail_arrays"]["q.1.3"]), internals[1].q[0, 3].numpy())
    np.testing.assert_array_equal(array(detail, meta["detail_arrays"]["k.1.1"]), internals[1].k[0, 1].numpy())
    np.testing.assert_array_equal(array(detail, meta["detail_arrays"]["v.0.0"]), internals[0].v[0, 0].numpy())


def test_long_inputs_are_cut_to_the_window_and_q_k_v_to_the_budget():
    model = lively_model(seed=6, block_size=64)
    idx = ids(60)
    internals = model.attention_internals(idx)
    full = explorer_html(internals, [str(t) for t in idx[0].tolist()], options=ExplorerOptions(window=40))
    meta, data, detail = page_data(full)
    assert meta["window"] == 40 and meta["n_tokens"] == 60 and len(meta["labels"]) == 40
    assert array(data, meta["arrays"]["scale.0"]).shape == (4, 40)
    np.testing.assert_array_equal(array(detail, meta["detail_arrays"]["q.0.0"]), internals[0].q[0, 0, :40].numpy())
    # a budget that fits the weights and about two heads' q, k, v: the file stays within it
    no_detail = len(explorer_html(internals, [str(t) for t in idx[0].tolist()],
                                  options=ExplorerOptions(window=40, max_bytes=1)).encode())
    head = 40 * 8 * 4 * 4 / 3  # one array, base64
    budget = int(no_detail + 7 * head + 2000)
    small = explorer_html(internals, [str(t) for t in idx[0].tolist()],
                          options=ExplorerOptions(window=40, max_bytes=budget))
    meta = page_data(small)[0]
    assert len(small.encode()) <= budget
    assert meta["detail_heads"] == {"0": [0, 1]}, meta["detail_heads"]
    assert page_data(explorer_html(internals, [str(t) for t in idx[0].tolist()],
                                   options=ExplorerOptions(max_bytes=1)))[2] == b""


def test_dump_writes_value_weighted_arrays_and_the_page(tmp_path):
    model = lively_model(seed=7, n_kv_head=1)
    idx = ids(10)
    internals = model.attention_internals(idx, layers=[1])
    written = dump_internals(internals, {1: [0, 2]}, list("abcdefghij"), tmp_path, token_ids=idx[0].tolist())
    assert sorted(p.name for p in written) == ["attention.html", "attn.npz", "layer_1.png"]
    with np.load(tmp_path / "attn.npz") as npz:
        assert set(npz.files) == {"tokens", "token_ids", "layer_1", "heads_1", "value_norm_1", "value_weighted_1"}
        norms = value_norms(internals[1].v, internals[1].out_weight, 4)[0].numpy()
        np.testing.assert_array_equal(npz["value_norm_1"], norms)
        np.testing.assert_allclose(npz["value_weighted_1"],
                                   value_weighted(internals[1].weights, internals[1].v, internals[1].out_weight)[0],
                                   rtol=1e-6, atol=0)
    meta = page_data((tmp_path / "attention.html").read_text(encoding="utf-8"))[0]
    assert meta["layers"] == [1] and meta["selected"] == {"1": [0, 2]} and meta["labels"] == list("abcdefghij")


def test_page_assets_ship_with_the_package():
    """pyproject's package data must name every file the page is built from, or an installed copy breaks."""
    text = (REPO / "pyproject.toml").read_text()  # (tomllib is Python 3.11+; the project runs on 3.10)
    assert re.search(r'^packages = \[[^\]]*"insight\.explorer"', text, re.M)
    section = text.split("[tool.setuptools.package-data]", 1)[1].split("\n[", 1)[0]
    patterns = re.findall(r'"([^"]+)"', re.search(r'^"insight\.explorer" = \[(.*)\]', section, re.M).group(1))
    for name in ("template.html", "explorer.js", "explorer.css"):
        assert (REPO / "insight" / "explorer" / name).is_file()
        assert any(Path(name).match(p) for p in patterns), name


# --- what each head does: the dump's head scores and the page's Statistics data ---------------------

CHARS = "abcdefghijklmnopqrstuvwxyz\n .,!"  # 31 characters: lively_model's vocabulary


def loss_without_head(model: GPT, idx: torch.Tensor, layer: int, head: int) -> float:
    """The prompt's mean next-token loss with W_O^h's columns of out_proj set to zero (a copy of the model)."""
    import copy
    ablated = copy.deepcopy(model)
    D = model.config.head_dim
    with torch.no_grad():
        ablated.blocks[layer].attn.out_proj.weight[:, head * D:(head + 1) * D] = 0.0
    targets = torch.full_like(idx, -1)
    targets[:, :-1] = idx[:, 1:]
    with torch.no_grad():
        return float(ablated(idx, targets)[1])


def test_dump_writes_what_every_head_of_every_layer_does(tmp_path):
    """attn.npz's head_* arrays are (n_layer, n_head) float32 for every layer, also when the dump selects one
    layer: prev_token = mean alpha_{i,i-1} over the prompt, duplicate/induction = the weights to i - R and
    i - R + 1 over the role probe's second copy, ablation = the prompt's loss with W_O^h zeroed minus the
    intact loss, each computed here from the model itself; the page carries the same numbers."""
    from data.tokenizer import CharTokenizer
    from insight.dump import ROLE_BATCH, prompt_head_scores
    from insight.roles import probe_length, role_label, role_probe
    model = lively_model(seed=8, n_layer=3, n_kv_head=2)
    tokenizer = CharTokenizer(CHARS)
    idx = ids(14, seed=9)
    scores, note = prompt_head_scores(model, idx, tokenizer)
    internals = model.attention_internals(idx, layers=[1])
    dump_internals(internals, {1: [0, 3]}, [CHARS[t] for t in idx[0].tolist()], tmp_path, token_ids=idx[0].tolist(),
                   scores=HeadScores(scores, note))
    with np.load(tmp_path / "attn.npz") as npz:
        arrays = {name: npz[f"head_{name}"] for name in ("prev_token", "duplicate_token", "induction", "ablation_dloss")}
        assert "layer_0" not in npz.files and "layer_2" not in npz.files  # maps of the selected layer only
    for a in arrays.values():
        assert a.shape == (3, 4) and a.dtype == np.float32 and np.isfinite(a).all()
    maps = model.attention_maps(idx)
    R = probe_length(32)
    probe = role_probe(tokenizer.ordinary_ids(), tokenizer.start_id, 32, batch=ROLE_BATCH, seed=0)
    probe_maps = model.attention_maps(probe)
    intact_targets = torch.full_like(idx, -1)
    intact_targets[:, :-1] = idx[:, 1:]
    with torch.no_grad():
        intact = float(model(idx, intact_targets)[1])
    for layer in range(3):
        w = maps[layer][0].double().numpy()  # (n_head, T, T)
        pw = probe_maps[layer].double().numpy()  # (B, n_head, 1 + 2R, 1 + 2R)
        for h in range(4):
            prev = np.mean([w[h, i, i - 1] for i in range(1, 14)])
            dup = np.mean([pw[b, h, i, i - R] for b in range(ROLE_BATCH) for i in range(R + 1, 2 * R + 1)])
            ind = np.mean([pw[b, h, i, i - R + 1] for b in range(ROLE_BATCH) for i in range(R + 1, 2 * R + 1)])
            assert arrays["prev_token"][layer, h] == pytest.approx(prev, abs=1e-6)
            assert arrays["duplicate_token"][layer, h] == pytest.approx(dup, abs=1e-6)
            assert arrays["induction"][layer, h] == pytest.approx(ind, abs=1e-6)
            assert arrays["ablation_dloss"][layer, h] == pytest.approx(loss_without_head(model, idx, layer, h) - intact,
                                                                       abs=1e-5)
    assert np.abs(arrays["ablation_dloss"]).max() > 1e-3  # heads matter to this model: the check has teeth
    meta = page_data((tmp_path / "attention.html").read_text(encoding="utf-8"))[0]
    assert meta["score_names"] == ["prev_token", "duplicate_token", "induction", "ablation_dloss"]
    for name, a in arrays.items():
        assert meta["scores"][name] == a.astype(np.float64).tolist()  # float32 values, exactly
    assert meta["roles"] == [[role_label(*(float(arrays[n][layer, h]) for n in ("prev_token", "duplicate_token",
                                                                               "induction"))) for h in range(4)]
                             for layer in range(3)]
    assert meta["n_layer"] == 3 and meta["layers"] == [1] and meta["scores_note"] == note
    assert "14 tokens" in note and f"the same {R} again" in note


def test_a_one_token_prompt_has_no_prev_token_or_ablation_score_and_says_why(tmp_path):
    from data.tokenizer import CharTokenizer
    from insight.dump import prompt_head_scores
    model = lively_model(seed=2)
    scores, note = prompt_head_scores(model, ids(1), CharTokenizer(CHARS))
    assert np.isnan(scores["prev_token"]).all() and np.isnan(scores["ablation_dloss"]).all()
    assert np.isfinite(scores["duplicate_token"]).all() and np.isfinite(scores["induction"]).all()  # the probe is fine
    assert "1-token prompt" in note and "NaN" in note
    html = explorer_html(model.attention_internals(ids(1)), ["a"], scores=HeadScores(scores, note))
    meta = page_data(html)[0]
    assert meta["scores"]["ablation_dloss"] == [[None] * 4, [None] * 4]  # NaN travels as null
    # a block too short for the role probe (1 + 2R positions, R >= 1): those two NaN, the rest measured
    short = lively_model(seed=2, block_size=2)
    scores, note = prompt_head_scores(short, ids(2), CharTokenizer(CHARS))
    assert np.isnan(scores["induction"]).all() and np.isnan(scores["duplicate_token"]).all()
    assert np.isfinite(scores["prev_token"]).all() and np.isfinite(scores["ablation_dloss"]).all()
    assert "block_size 2" in note


def test_head_scores_are_checked_and_labelled():
    model = lively_model(seed=3)
    internals = model.attention_internals(ids(6))
    tokens = list("abcdef")
    score = np.zeros((2, 4))
    with pytest.raises(ValueError, match="unknown score"):
        explorer_html(internals, tokens, scores=HeadScores({"induktion": score}))
    with pytest.raises(ValueError, match=r"\(n_layer, 4\)"):
        explorer_html(internals, tokens, scores=HeadScores({"induction": np.zeros((2, 3))}))
    with pytest.raises(ValueError, match=r"\(n_layer, 4\)"):
        explorer_html(internals, tokens, scores=HeadScores({"induction": score, "prev_token": np.zeros((3, 4))}))
    induction, prev = score.copy(), score.copy()
    induction[1, 2], prev[0, 1], prev[1, 2] = 0.41, 0.9, 0.9  # induction wins where both pass
    scores = HeadScores({"induction": induction, "prev_token": prev})
    meta = page_data(explorer_html(internals, tokens, scores=scores))[0]
    assert meta["score_names"] == ["prev_token", "induction"]
    assert meta["roles"] == [["", "previous-token", "", ""], ["", "", "induction", ""]]
    assert meta["role_rules"] == [["induction", "induction", 0.4], ["previous-token", "prev_token", 0.4],
                                  ["duplicate-token", "duplicate_token", 0.4]]
    assert page_data(explorer_html(internals, tokens))[0]["score_names"] == []  # a page without them


@pytest.mark.parametrize("tokens,first", [
    (["tok"] * 40, "head"),  # 40 tokens of several characters: the head view
    (["tok"] * 41, "text"),  # a long prompt: the text view
    (list("ROMEO: "), "text"),  # char-level: the text view, however short
    (["ab", "c"], "head"),
])
def test_long_and_char_level_prompts_open_on_the_text_view(tokens, first):
    model = lively_model(seed=1, block_size=64)
    meta = page_data(explorer_html(model.attention_internals(ids(len(tokens))), tokens))[0]
    assert meta["first_view"] == first
    assert meta["texts"] == tokens  # the text view's running text: the tokens as they are
