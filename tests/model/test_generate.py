"""Generation: the KV-cache path against the recompute-the-window reference, the sampling filters, the
cache's size, stopping, and the attention dumps that sample.py writes (the sampling filters:
tests/model/test_generate_sampling.py).

Models are tiny (block_size 16, so a few dozen new tokens slide the window several times) and random.
GPT-2's init (std 0.02) makes a random model's logits nearly uniform and its greedy output one token
repeated, so equal outputs would prove little: `lively` re-draws the weights with std 0.3, which makes
the next token depend on the context, and the tests check that the outputs are varied.
"""
from __future__ import annotations

import math

import matplotlib.image
import numpy as np
import pytest
import torch

from model import GPT, ModelConfig
from insight.dump import dump_attention
from model.generate import generate

VOCAB = 29
BLOCK = 16
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

ARCHS = {
    # GPT-2 style: multi-head, learned positions, LayerNorm with biases, GELU, untied head; fused attention
    "mha": dict(n_kv_head=4, pos="learned", norm="layernorm", mlp="gelu", bias=True, tie_embeddings=False,
                attn_impl="sdpa"),
    "gqa": dict(n_kv_head=2),  # LLaMA style: RoPE, RMSNorm, SwiGLU; from-scratch attention
    "mqa": dict(n_kv_head=1, attn_impl="sdpa"),
}


def tiny(**overrides) -> ModelConfig:
    base = dict(vocab_size=VOCAB, block_size=BLOCK, n_layer=2, n_head=4, d_model=32, pos="rope", norm="rmsnorm",
                mlp="swiglu", attn_impl="manual")
    base.update(overrides)
    return ModelConfig(**base)


def lively(config: ModelConfig, seed: int = 0) -> GPT:
    """A random GPT in eval mode whose matrices have std 0.3: its logits are far from uniform and depend on
    the context (see the module docstring)."""
    torch.manual_seed(seed)
    model = GPT(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    return model.eval()


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models run sub-millisecond ops, where two intra-op threads only add synchronisation; when other
    jobs share the machine's two cores, spinning OpenMP threads made these tests ~70x slower (5 s instead
    of 0.06 s per generation). One thread for this module, restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def prompts(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


class CallRecorder:
    """Records every GPT.forward call made by `generate`: its idx, input_pos and logits."""

    def __init__(self, model: GPT):
        self.calls: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]] = []
        self.handle = model.register_forward_hook(self.hook, with_kwargs=True)

    def hook(self, module, args, kwargs, output) -> None:
        idx = args[0] if args else kwargs["idx"]
        with torch.inference_mode(False):  # plain copies of what generate (in inference mode) passed and got
            self.calls.append((idx.clone(), kwargs.get("input_pos"), output[0].detach().clone()))

    def __enter__(self) -> CallRecorder:
        return self

    def __exit__(self, *exc) -> None:
        self.handle.remove()


# --------------------------------------------------------------------------------------------------
# the cache path equals the reference


SAMPLING = {
    "greedy": dict(temperature=0.0),
    "temperature1": dict(temperature=1.0),
    "top_k": dict(temperature=1.0, top_k=5),
    "top_p": dict(temperature=1.0, top_p=0.8),
}


@pytest.mark.parametrize("sampling", SAMPLING)
@pytest.mark.parametrize("arch", ARCHS)
def test_cached_and_uncached_generation_give_identical_tokens(arch, sampling):
    """Same seed, same tokens, through three window slides (5 + 40 tokens with block_size 16)."""
    model = lively(tiny(**ARCHS[arch]))
    prompt = prompts(2, 5)
    outs = {}
    for use_cache in (True, False):
        generator = torch.Generator().manual_seed(123)
        outs[use_cache] = generate(model, prompt, 40, generator=generator, use_kv_cache=use_cache,
                                   **SAMPLING[sampling])
    assert outs[True].shape == (2, 45)
    assert torch.equal(outs[True][:, :5], prompt)
    assert torch.equal(outs[True], outs[False])
    for row in outs[True][:, 5:]:
        assert len(set(row.tolist())) >= 4, "degenerate output: the equality would prove little"
    assert model.blocks[0].attn.kv_cache is None, "generate must release its cache"


@pytest.mark.parametrize("arch", ARCHS)
def test_cached_logits_equal_full_forward_logits_at_every_step(arch):
    """Every forward of the cached path (the prefill, each one-token step, each re-prefill after a slide)
    gives the logits of a full forward (no cache, every position) over the same window, for a batch of 3
    different prompts. generate asks for the last position only; the uncached path is compared too."""
    model = lively(tiny(**ARCHS[arch]), seed=2)
    prompt = prompts(3, 6, seed=3)
    recorded = {}
    for use_cache in (True, False):
        with CallRecorder(model) as rec:
            out = generate(model, prompt, 30, temperature=0.0, use_kv_cache=use_cache)
        recorded[use_cache] = rec.calls
    cached, full = recorded[True], recorded[False]
    assert len(cached) == len(full) >= 30
    prefills = [i for i, (idx, _, _) in enumerate(cached) if idx.shape[1] > 1]
    assert len(prefills) >= 3, "the window should have slid at least twice"
    for (c_idx, c_pos, c_logits), (f_idx, f_pos, f_logits) in zip(cached, full):
        t = c_idx.shape[1]
        assert c_pos is not None and f_pos is None
        assert torch.equal(c_idx, f_idx[:, -t:]), "the cached call fed other tokens than the window's last"
        assert c_logits.shape == f_logits.shape == (3, 1, VOCAB)
        every_position, _ = model(f_idx)  # (3, window, VOCAB): no cache is set up between generate calls
        torch.testing.assert_close(c_logits, every_position[:, -1:], atol=1e-5, rtol=0)
        torch.testing.assert_close(f_logits, every_position[:, -1:], atol=1e-5, rtol=0)
        if t > 1:  # a prefill: its input is the whole window
            assert torch.equal(c_idx, f_idx)
    assert len({tuple(r) for r in out[:, 6:].tolist()}) == 3, "the three rows should differ"


@pytest.mark.parametrize("arch", ARCHS)
def test_a_cached_prefill_gives_full_forward_logits_at_every_position(arch):
    """The cache path itself is position-exact, not only at the last position generate reads: a prefill
    of 7 tokens then 3 one-token steps equal a full forward over the 10 tokens, position by position."""
    model = lively(tiny(**ARCHS[arch]), seed=4)
    idx = prompts(2, 10, seed=5)
    expected, _ = model(idx)  # (2, 10, VOCAB)
    model.setup_kv_cache(batch_size=2, max_len=BLOCK)
    try:
        pieces = [model(idx[:, :7], input_pos=torch.arange(7))[0]]
        pieces += [model(idx[:, n:n + 1], input_pos=torch.tensor([n]))[0] for n in range(7, 10)]
    finally:
        model.clear_kv_cache()
    torch.testing.assert_close(torch.cat(pieces, dim=1), expected, atol=1e-5, rtol=0)


def test_last_only_logits_are_the_last_position_and_refuse_targets():
    model = lively(tiny(), seed=6)
    idx = prompts(2, 9, seed=7)
    torch.testing.assert_close(model(idx, last_only=True)[0], model(idx)[0][:, -1:], atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="last_only"):
        model(idx, targets=idx, last_only=True)


def test_window_slides_to_last_half_and_refills_from_position_zero():
    """The slide policy itself: while the window has room, one token at the next position; when it is full,
    the last block_size // 2 tokens are fed again at positions 0.. (never a position >= block_size)."""
    model = lively(tiny(**ARCHS["gqa"]))
    prompt = prompts(1, 11)
    with CallRecorder(model) as rec:
        out = generate(model, prompt, 30, temperature=0.0)
    keep = BLOCK // 2
    first_idx, first_pos, _ = rec.calls[0]
    assert torch.equal(first_idx, prompt) and torch.equal(first_pos, torch.arange(11))
    n = 11  # tokens in the window
    slides = 0
    for k, (idx, pos, _) in enumerate(rec.calls[1:], start=1):  # the call after the k-th new token
        seen = out[:, :11 + k]  # every token so far
        if n == BLOCK:
            slides += 1
            n = keep
            assert torch.equal(pos, torch.arange(keep))
            assert torch.equal(idx, seen[:, -keep:])
        else:
            assert torch.equal(pos, torch.tensor([n]))
            assert torch.equal(idx, seen[:, -1:])
            n += 1
        assert int(pos.max()) < BLOCK
    assert slides == 3  # 11 + 30 tokens: full at 16, then every 8 more


def test_prompt_longer_than_block_size_keeps_its_last_block_size_tokens():
    model = lively(tiny(**ARCHS["gqa"]))
    long_prompt = prompts(1, BLOCK + 7)
    out = generate(model, long_prompt, 5, temperature=0.0)
    assert torch.equal(out[:, :BLOCK], long_prompt[:, -BLOCK:])
    assert torch.equal(out, generate(model, long_prompt[:, -BLOCK:], 5, temperature=0.0))
    assert torch.equal(out, generate(model, long_prompt, 5, temperature=0.0, use_kv_cache=False))


def test_rows_of_a_batch_do_not_interact():
    """Each row of a batched, cached generation equals generating that prompt alone: the cache rows
    (and the shared causal mask) keep the sequences apart."""
    model = lively(tiny(**ARCHS["gqa"]))
    batch = prompts(3, 5, seed=4)
    together = generate(model, batch, 25, temperature=0.0)
    for i in range(3):
        assert torch.equal(together[i:i + 1], generate(model, batch[i:i + 1], 25, temperature=0.0))


def test_stop_token_ends_generation_once_every_row_produced_it():
    """A row that produced the stop token keeps going (the caller cuts it) until every row has; then
    generation stops right after the last row's stop token. on_token streams every column."""
    model = lively(tiny(**ARCHS["gqa"]))
    n_new = 30
    for seed in range(20):  # find prompts whose greedy outputs share a token, first seen at different steps
        prompt = prompts(2, 4, seed=seed)
        free = generate(model, prompt, n_new, temperature=0.0)[:, 4:]
        firsts = {}
        for token in set(free[0].tolist()) & set(free[1].tolist()):
            steps = [row.tolist().index(token) for row in free]
            if steps[0] != steps[1] and max(steps) < n_new - 1:
                firsts[token] = steps
        if firsts:
            break
    assert firsts, "no suitable prompt found"
    stop, steps = next(iter(firsts.items()))
    for use_cache in (True, False):
        streamed = []
        out = generate(model, prompt, n_new, temperature=0.0, stop_token=stop, use_kv_cache=use_cache,
                       on_token=streamed.append)
        assert out.shape[1] == 4 + max(steps) + 1, "should stop right after the last row's stop token"
        assert torch.equal(out[:, 4:], free[:, :max(steps) + 1])
        assert int(out[:, -1].eq(stop).sum()) >= 1
        assert torch.equal(torch.stack(streamed, dim=1), out[:, 4:])
    never = ({*range(VOCAB)} - set(free.flatten().tolist()))
    if never:  # a token nobody produces never stops anything
        assert generate(model, prompt, n_new, temperature=0.0, stop_token=min(never)).shape[1] == 4 + n_new


@pytest.mark.parametrize("use_cache", [True, False])
def test_a_generation_of_n_tokens_runs_one_pass_for_each_and_none_after_the_last(use_cache):
    """The prefill gives the first token, each later token one more pass (a one-token step with the cache, the
    window again without); nothing runs after the last token, whose logits nobody would read."""
    model = lively(tiny(**ARCHS["gqa"]))
    passes = []
    model.blocks[0].register_forward_pre_hook(lambda block, args: passes.append(args[0].shape[1]))
    for n_new in (1, 2, 7):
        passes.clear()
        out = generate(model, prompts(1, 4, seed=0), n_new, temperature=0.0, use_kv_cache=use_cache)
        assert out.shape[1] == 4 + n_new
        assert passes == [4] + ([1] * (n_new - 1) if use_cache else list(range(5, 4 + n_new))), passes


def test_seeded_sampling_is_reproducible():
    model = lively(tiny(**ARCHS["gqa"]))
    runs = [generate(model, prompts(2, 3), 20, generator=torch.Generator().manual_seed(s)) for s in (9, 9, 10)]
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2])


# --------------------------------------------------------------------------------------------------
# the cache's size


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_cache_bytes_shrink_by_the_gqa_factor(dtype):
    """bytes = 2 (k and v) * n_layer * B * n_kv_head * max_len * head_dim * itemsize; GQA divides the
    multi-head size by n_head / n_kv_head exactly."""
    sizes = {}
    for n_kv_head in (4, 2, 1):
        model = GPT(tiny(n_layer=3, n_kv_head=n_kv_head))
        sizes[n_kv_head] = model.setup_kv_cache(batch_size=3, max_len=12, dtype=dtype)
        head_dim = model.config.head_dim
        assert sizes[n_kv_head] == 2 * 3 * 3 * n_kv_head * 12 * head_dim * dtype.itemsize
        for block in model.blocks:  # the number is what the buffers really hold
            assert block.attn.kv_cache.k_cache.shape == (3, n_kv_head, 12, head_dim)
            assert block.attn.kv_cache.k_cache.dtype == dtype
        assert sizes[n_kv_head] == sum(b.attn.kv_cache.k_cache.nbytes + b.attn.kv_cache.v_cache.nbytes
                                       for b in model.blocks)
        model.clear_kv_cache()
        assert all(b.attn.kv_cache is None for b in model.blocks)
    assert sizes[4] == 2 * sizes[2] == 4 * sizes[1]


@pytest.mark.parametrize("attn_impl", ["manual", "sdpa"])
def test_a_cache_in_another_dtype_holds_the_rounded_keys_and_is_read_back_in_the_models(attn_impl):
    """A float32 model with a bfloat16 cache (half the memory): the cache holds the prompt's k, v rounded to
    bfloat16, exactly, and attention reads them back as float32, so the logits stay close to a float32 cache."""
    model = lively(tiny(n_kv_head=2, attn_impl=attn_impl))
    prompt = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(4))
    steps = torch.randint(0, VOCAB, (2, 3), generator=torch.Generator().manual_seed(5))
    logits, caches = {}, {}
    for dtype in (torch.float32, torch.bfloat16):
        model.setup_kv_cache(batch_size=2, max_len=BLOCK, dtype=dtype)
        with torch.no_grad():
            out = [model(prompt, input_pos=torch.arange(6))[0][:, -1]]
            caches[dtype] = [(b.attn.kv_cache.k_cache.clone(), b.attn.kv_cache.v_cache.clone())
                             for b in model.blocks]
            for i in range(steps.shape[1]):
                out.append(model(steps[:, i:i + 1], input_pos=torch.tensor([6 + i]))[0][:, -1])
        logits[dtype] = torch.stack(out, dim=1)  # (B, 4, vocab), float32 both times
        model.clear_kv_cache()
    (k32, v32), (k16, v16) = caches[torch.float32][0], caches[torch.bfloat16][0]  # the first layer's input is
    assert k16.dtype == v16.dtype == torch.bfloat16                                # the same both times
    assert torch.equal(k16, k32.to(torch.bfloat16)) and torch.equal(v16, v32.to(torch.bfloat16))
    assert logits[torch.bfloat16].dtype == torch.float32
    torch.testing.assert_close(logits[torch.bfloat16], logits[torch.float32], atol=0.1, rtol=0.05)
    assert not torch.equal(logits[torch.bfloat16], logits[torch.float32])  # the rounding did reach the logits


def _decode_logits(model: GPT, cache_dtype: torch.dtype, prompt: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """(B, 1 + steps, vocab): the prefill's last logits, then each decoded step's, through a cache of cache_dtype."""
    model.setup_kv_cache(batch_size=prompt.shape[0], max_len=BLOCK, dtype=cache_dtype)
    try:
        with torch.no_grad():
            out = [model(prompt, input_pos=torch.arange(prompt.shape[1]), last_only=True)[0][:, -1]]
            for i in range(steps.shape[1]):
                out.append(model(steps[:, i:i + 1], input_pos=torch.tensor([prompt.shape[1] + i]))[0][:, -1])
    finally:
        model.clear_kv_cache()
    return torch.stack(out, dim=1)


@pytest.mark.parametrize("n_kv_head", [4, 2])
def test_a_float32_cache_under_a_bfloat16_model_is_attended_over_in_float32(n_kv_head):
    """The fused path over a float32 cache runs the kernel in float32 on the widened bfloat16 keys and values: the
    very numbers of a bfloat16 cache read by the kernel on float32 copies ("fused float32"), and not those of the
    bfloat16 kernel (which a float32 cache narrowed back to bfloat16 would give)."""
    model = lively(tiny(n_kv_head=n_kv_head, attn_impl="sdpa")).to(torch.bfloat16)
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(6))
    steps = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(7))
    narrow = _decode_logits(model, torch.bfloat16, prompt, steps)
    wide = _decode_logits(model, torch.float32, prompt, steps)
    model.set_attention_kernel("fused float32")
    upcast = _decode_logits(model, torch.bfloat16, prompt, steps)
    model.set_attention_kernel("fused")
    assert wide.dtype == torch.bfloat16
    assert torch.equal(wide, upcast)
    assert not torch.equal(wide, narrow)  # the bfloat16 kernel rounds differently: the test can tell them apart
    torch.testing.assert_close(wide.float(), narrow.float(), atol=0.25, rtol=0.05)


def test_a_float32_cache_under_a_bfloat16_model_gives_the_maps_the_uncached_pass_gives():
    """The from-scratch path (weights wanted) reads a float32 cache back in the model's dtype: the cached decode's
    logits are those of a bfloat16 cache."""
    model = lively(tiny(n_kv_head=2)).to(torch.bfloat16)  # attn_impl manual
    prompt = torch.randint(0, VOCAB, (1, 4), generator=torch.Generator().manual_seed(8))
    steps = torch.randint(0, VOCAB, (1, 5), generator=torch.Generator().manual_seed(9))
    assert torch.equal(_decode_logits(model, torch.float32, prompt, steps),
                       _decode_logits(model, torch.bfloat16, prompt, steps))


def test_decode_cache_dtype_widens_only_an_eager_cpu_decode_of_a_narrower_model_that_measured_faster(monkeypatch):
    import model.generate as generation
    from model.generate import decode_cache_dtype
    asked = []

    def faster(answer):
        monkeypatch.setattr(generation, "float32_attention_faster", lambda *shape: asked.append(shape) or answer)

    bf16 = GPT(tiny(n_kv_head=2)).to(torch.bfloat16)
    faster(True)
    assert decode_cache_dtype(bf16, 3, BLOCK) == torch.float32
    cfg = bf16.config  # timed at the model's head shape, the batch and half the cache's length
    assert asked == [(torch.bfloat16, 3, cfg.n_head, cfg.n_kv_head, cfg.head_dim, BLOCK // 2)]
    assert decode_cache_dtype(bf16, 3, 1) == torch.float32 and asked[-1][-1] == 1
    faster(False)
    assert decode_cache_dtype(bf16, 3, BLOCK) == torch.bfloat16
    asked.clear()
    faster(True)
    assert decode_cache_dtype(bf16, 3, BLOCK, compiled=True) == torch.bfloat16
    assert decode_cache_dtype(GPT(tiny()), 3, BLOCK) == torch.float32
    assert asked == []  # neither a compiled step nor a float32 model is timed


def test_generate_keeps_its_cache_in_the_dtype_decode_cache_dtype_chose(monkeypatch):
    import model.generate as generation
    model = lively(tiny(n_kv_head=2, attn_impl="sdpa")).to(torch.bfloat16)
    prompt = torch.randint(0, VOCAB, (1, 4), generator=torch.Generator().manual_seed(10))
    seen = []
    real = GPT.setup_kv_cache
    monkeypatch.setattr(GPT, "setup_kv_cache", lambda self, *a, **kw: seen.append(kw["dtype"]) or real(self, *a, **kw))
    outputs = {}
    for wide in (True, False):
        monkeypatch.setattr(generation, "float32_attention_faster", lambda *shape, wide=wide: wide)
        outputs[wide] = generate(model, prompt, 6, temperature=0)
    assert seen == [torch.float32, torch.bfloat16]
    assert outputs[True].shape == outputs[False].shape == (1, 10)


def test_float32_attention_faster_times_both_kernels_and_answers_once_per_shape(monkeypatch):
    import model.generate as generation
    calls = []
    real = generation.fused_attention
    monkeypatch.setattr(generation, "fused_attention", 
                        lambda q, k, *a, **kw: calls.append((k.dtype, kw.get("float32", False))) or real(q, k, *a, **kw))
    generation.float32_attention_faster.cache_clear()
    torch.manual_seed(11)
    expected_draw = torch.rand(3)
    torch.manual_seed(11)
    answer = generation.float32_attention_faster(torch.bfloat16, 1, 4, 2, 8, 7)
    assert torch.equal(torch.rand(3), expected_draw)  # the timing drew nothing from the global generator
    assert isinstance(answer, bool)
    # a warm-up and 3 rounds of 2 calls of each: the bfloat16 kernel, and the float32 one on a float32 cache
    assert calls.count((torch.bfloat16, False)) == calls.count((torch.float32, True)) == 1 + 3 * 2
    assert len(calls) == 14
    assert generation.float32_attention_faster(torch.bfloat16, 1, 4, 2, 8, 7) is answer
    assert len(calls) == 14  # the second question is answered from the cache
    generation.float32_attention_faster.cache_clear()


def test_kv_cache_longer_than_block_size_is_refused():
    with pytest.raises(ValueError, match="block_size"):
        GPT(tiny()).setup_kv_cache(batch_size=1, max_len=BLOCK + 1)


def test_cache_buffers_are_not_saved_in_the_state_dict():
    model = GPT(tiny())
    before = set(model.state_dict())
    model.setup_kv_cache(batch_size=1)
    assert set(model.state_dict()) == before


# --------------------------------------------------------------------------------------------------
# attention dumps


def reference_maps(model: GPT, idx: torch.Tensor) -> dict[int, torch.Tensor]:
    """{layer: (B, n_head, T, T)} float64, recomputed without model/gpt.py: each layer's input is
    taken by a forward hook on blocks[L].attn (it is already normalised), then qkv projection -> RoPE
    (channel pairs (2i, 2i+1) rotated by pos * theta^(-2i/D), in float64) -> softmax(q k^T / sqrt(d)) with the future masked."""
    cfg = model.config
    inputs: dict[int, torch.Tensor] = {}
    handles = [block.attn.register_forward_hook(lambda mod, args, out, layer=layer: inputs.__setitem__(layer, args[0]))
               for layer, block in enumerate(model.blocks)]
    try:
        with torch.no_grad():
            model(idx)
    finally:
        for h in handles:
            h.remove()
    B, T = idx.shape
    H, KV, D = cfg.n_head, cfg.n_kv_head, cfg.head_dim
    inv_freq = cfg.rope_theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    angles = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]  # (T, D/2)
    cos, sin = angles.cos(), angles.sin()

    def rotate(x: torch.Tensor) -> torch.Tensor:
        even, odd = x[..., 0::2], x[..., 1::2]  # (B, heads, T, D/2): the two coordinates of each pair
        return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)

    maps = {}
    for layer, x in inputs.items():
        x = x.detach()
        proj = model.blocks[layer].attn.qkv_proj
        weight = proj.weight.detach().double()
        qkv = x.double() @ weight.T + (proj.bias.detach().double() if proj.bias is not None else 0.0)
        q = qkv[..., :H * D].reshape(B, T, H, D).transpose(1, 2)
        k = qkv[..., H * D:(H + KV) * D].reshape(B, T, KV, D).transpose(1, 2)
        if cfg.pos == "rope":
            q, k = rotate(q), rotate(k)
        k = k.repeat_interleave(H // KV, dim=1)  # query head h reads kv head h // (H / KV)
        scores = q @ k.transpose(-1, -2) / math.sqrt(D)
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        maps[layer] = torch.softmax(scores, dim=-1)
    return maps


@pytest.mark.parametrize("arch", ["mha", "gqa"])
def test_dumped_maps_are_causal_distributions_equal_to_a_recomputation(arch, tmp_path):
    """What sample.py --dump-attn does: GPT.attention_maps -> dump_attention. The npz holds layer_L
    (n_head, T, T) for each selected layer, the selected heads and the tokens; one PNG per layer."""
    model = lively(tiny(n_layer=3, **ARCHS[arch]), seed=6)
    T = 12
    idx = prompts(1, T, seed=8)
    tokens = [f"t{i}" for i in idx[0].tolist()]
    heads = {0: [0, 1, 2, 3], 2: [1, 3]}
    maps = model.attention_maps(idx, layers=sorted(heads))
    written = dump_attention({layer: w[0] for layer, w in maps.items()}, heads, tokens, tmp_path)
    assert sorted(p.name for p in written) == ["attn.npz", "layer_0.png", "layer_2.png"]

    expected = reference_maps(model, idx)
    with np.load(tmp_path / "attn.npz") as npz:
        assert set(npz.files) == {"tokens", "layer_0", "heads_0", "layer_2", "heads_2"}
        assert npz["tokens"].tolist() == tokens
        for layer, selected in heads.items():
            w = npz[f"layer_{layer}"]
            assert w.shape == (4, T, T) and w.dtype == np.float32
            np.testing.assert_allclose(w.sum(axis=-1), 1.0, atol=1e-5)
            assert (w[:, np.triu_indices(T, k=1)[0], np.triu_indices(T, k=1)[1]] == 0).all()
            np.testing.assert_allclose(w, expected[layer][0].numpy(), atol=1e-5, rtol=0)
            assert npz[f"heads_{layer}"].tolist() == selected
    # the maps are not trivially uniform: a broken recomputation could not pass by accident
    assert float(expected[0][0].std()) > 0.05
    for layer in heads:
        png = tmp_path / f"layer_{layer}.png"
        assert png.read_bytes()[:8] == PNG_SIGNATURE
        image = matplotlib.image.imread(png)
        assert image.ndim == 3 and image.shape[0] > 50 and image.shape[1] > 50


def test_what_generate_hands_out_is_plain_and_what_it_leaves_serves_later_callers():
    """generate runs in inference mode, but the tokens it returns and streams are plain tensors (they can be
    changed in place and trained on), and the KV cache pool, the causal table and the LM head's column copy it
    leaves behind serve later callers outside that mode: set up again and zeroed, read by a no-grad forward."""
    model = lively(tiny(), seed=4)
    prompt = prompts(2, 5, seed=6)
    streamed, modes = [], set()
    def on_token(token):
        streamed.append(token)
        modes.add((torch.is_inference_mode_enabled(), torch.is_grad_enabled()))
    out = generate(model, prompt, 6, temperature=0.0, on_token=on_token)
    assert not out.is_inference() and not any(t.is_inference() for t in streamed)
    assert modes == {(False, False)}  # the callback runs outside inference mode, without grad
    assert torch.equal(torch.stack(streamed, dim=1), out[:, 5:])
    out[:, 0] = 0  # in place: refused on an inference tensor outside inference mode
    model.train()
    _, loss = model(out[:, :-1], targets=out[:, 1:])
    loss.backward()  # the returned tokens feed a training step
    model.eval()
    model.setup_kv_cache(2, 11)  # the pooled buffers generate used, zeroed outside inference mode
    assert not model.blocks[0].attn.kv_cache.k_cache.is_inference() and not model.causal_table.is_inference()
    with torch.no_grad():
        stepped, _ = model(prompt, input_pos=torch.arange(5))
    model.clear_kv_cache()
    assert not model.head_columns().is_inference()
    with torch.no_grad():
        torch.testing.assert_close(stepped, model(prompt)[0], atol=1e-5, rtol=0)
