"""sample.py --quantize: the text is the quantized model's own greedy text, the tokens/s line names the
quantization, an attention dump says its maps come from int8 weights (attn.npz's `quantized`, the explorer's
header line), and what cannot run (another device, weight-only int8 in float16, an unknown mode) is one
line and exit status 2 before the model is built."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

import sample
from data.tokenizer import CharTokenizer
from model.generate import generate
from model.quantize import Int8Linear, quantize_int8
from pretrained.checkpoint import load_model
from tests.cli.test_sample import assert_user_error
from tests.cli.test_sample import sample as sample_cli
from tests.cli import test_sample_settings
from tests.cli.test_sample_settings import CHARS, PROMPT, run

ckpt = test_sample_settings.ckpt  # its module-scoped random checkpoint, as a fixture of this module too


@pytest.mark.parametrize("flags,fragments", [
    (["--device", "cuda", "--dtype", "bfloat16", "--quantize", "int8"],
     ["--quantize int8 runs on a CPU only", "--device cuda", "drop --quantize, or use --device cpu"]),
    (["--device", "mps", "--quantize", "int8-dynamic"], ["--quantize int8-dynamic runs on a CPU only", "--device cpu"]),
    (["--quantize", "int8", "--dtype", "float16"], ["--quantize int8", "not --dtype float16", "use --dtype float32"]),
    (["--quantize", "int4"], ["--quantize", "invalid choice", "'int4'"]),
])
def test_what_cannot_run_quantized_is_one_line(ckpt, flags, fragments):
    assert_user_error(sample_cli("--ckpt", str(ckpt), "--prompt", PROMPT, "--max-new-tokens", "2", *flags), *fragments)


def test_a_device_resolved_to_a_gpu_is_refused_before_the_model_is_built(capsys, ckpt, monkeypatch):
    monkeypatch.setattr("common.device.resolve_device", lambda *args, **kwargs: torch.device("cuda"))

    def never(*args, **kwargs):
        raise AssertionError("the model was built")

    monkeypatch.setattr("pretrained.load.Pretrained.build", never)
    with pytest.raises(SystemExit) as exit_:
        sample.main(["--ckpt", str(ckpt), "--device", "auto", "--quantize", "int8-dynamic", "--prompt", PROMPT])
    assert exit_.value.code == 2
    assert "runs on a CPU only" in capsys.readouterr().err


@pytest.mark.parametrize("mode,dtype", [("int8", "bfloat16"), ("int8", "float32"), ("int8-dynamic", "float32")])
def test_the_text_is_the_quantized_models_own_and_the_speed_line_says_so(capsys, ckpt, mode, dtype):
    out, err = run(capsys, ckpt, "--quantize", mode, "--dtype", dtype, "--temperature", "0")
    model, payload = load_model(ckpt)
    model = model.to(getattr(torch, dtype))
    quantize_int8(model, mode, lm_head=False)  # the head's choice is measured: compare the block layers' text
    tokenizer = CharTokenizer(payload["tokenizer"]["chars"])
    expected = tokenizer.decode(generate(model, torch.tensor([tokenizer.encode(PROMPT)]), 30, temperature=0.0)[0].tolist())
    head_int8 = re.search(r"LM head (int8|float)", err).group(1) == "int8"
    if not head_int8:  # with an int8 head too the text may differ from this one by the head's rounding
        assert out.rstrip("\n") == expected
    assert f"--quantize {mode}" in err.splitlines()[-1] and "tokens/s" in err.splitlines()[-1]
    assert f"quantized: {mode}" in err


def test_a_quantized_dump_says_its_maps_come_from_int8_weights(capsys, ckpt, tmp_path):
    _, err = run(capsys, ckpt, "--quantize", "int8-dynamic", "--dump-attn", "all", "--dump-dir", str(tmp_path / "d"),
                 "--max-new-tokens", "1", "--no-circuit")
    description = re.search(r"quantized: (.*)", err).group(1)
    with np.load(tmp_path / "d" / "attn.npz") as npz:
        assert str(npz["quantized"]) == description
        dumped = npz["layer_1"]
    page = (tmp_path / "d" / "attention.html").read_text()
    meta = json.loads(re.search(r'id="attn-meta">(.*?)</script>', page, re.S).group(1))
    assert meta["info"] == "from int8-quantized weights"
    # the maps are the quantized model's: computed again here from a model quantized the same way
    model, _ = load_model(ckpt)
    quantize_int8(model, "int8-dynamic", lm_head=False)  # the head does not reach the maps
    assert isinstance(model.blocks[1].attn.qkv_proj, Int8Linear)
    ids = torch.tensor([CharTokenizer(CHARS).encode(PROMPT)])
    np.testing.assert_allclose(dumped, model.attention_maps(ids)[1][0].numpy(), atol=1e-6)
    float_model, _ = load_model(ckpt)
    assert not np.allclose(dumped, float_model.attention_maps(ids)[1][0].numpy(), atol=1e-6)  # int8 shows
    # a float dump has no such entry and no such line
    run(capsys, ckpt, "--dump-attn", "all", "--dump-dir", str(tmp_path / "f"), "--max-new-tokens", "1", "--no-circuit")
    with np.load(tmp_path / "f" / "attn.npz") as npz:
        assert "quantized" not in npz.files
    float_page = (tmp_path / "f" / "attention.html").read_text()
    assert json.loads(re.search(r'id="attn-meta">(.*?)</script>', float_page, re.S).group(1))["info"] == ""


def test_head_scores_and_the_circuit_run_on_a_quantized_bfloat16_model(capsys, ckpt, tmp_path):
    """They read `.weight` (composition scores, W_O, the unembedding): the dequantized weights, in bfloat16."""
    run(capsys, ckpt, "--quantize", "int8", "--dtype", "bfloat16", "--dump-attn", "all", "--dump-dir",
        str(tmp_path / "d"), "--max-new-tokens", "1")
    with np.load(tmp_path / "d" / "attn.npz") as npz:
        assert "int8" in str(npz["quantized"])
        composition = npz["circuit_composition"][:, 0, :, 1, :]  # layer 0's heads into layer 1's: all defined
        assert np.isfinite(composition).all() and np.isfinite(npz["head_ablation_dloss"]).all()
        assert np.isfinite(npz["head_direct_logit"]).all()
