"""The attention monitor's settings (attn.*, wandb.attn_interval) change what a run records: each test fails
when its setting is ignored or off by one."""
from __future__ import annotations

from pathlib import Path

import pytest

from data.prepare import prepare_data
from tests.helpers import prepared_shakespeare_dir, tiny_config
from training.attn_monitor import default_layers, probe_ids
from training.trainer import train


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return prepared_shakespeare_dir(tmp_path_factory.mktemp("data"))


pytestmark = pytest.mark.usefixtures("data_env")  # conftest.py: ATTNGPT_DATA_DIR -> data_dir, W&B off


def test_the_probe_is_the_start_of_the_val_split_or_the_probe_text():
    cfg = tiny_config(Path("unused"))
    prepared = prepare_data(cfg.data)
    val = prepared.stream("val").read(0, 64)
    train_tokens = prepared.stream("train").read(0, 64)
    assert probe_ids(cfg, prepared, 32) == val[:32].tolist() != train_tokens[:32].tolist()
    assert probe_ids(cfg, prepared, 7) == val[:7].tolist()
    text_cfg = tiny_config(Path("unused"), "attn.probe_text=ROMEO: Who is there?")  # the text as the shell passes it
    assert probe_ids(text_cfg, prepared, 32) == prepared.tokenizer.encode("ROMEO: Who is there?")
    assert probe_ids(text_cfg, prepared, 5) == prepared.tokenizer.encode("ROMEO")  # cut to block_size


def test_default_layers_are_first_middle_and_last():
    assert default_layers(1) == [0] and default_layers(2) == [0, 1] and default_layers(5) == [0, 2, 4]
    assert default_layers(6) == [0, 3, 5]


def stats_keys(out: Path) -> list[tuple[int, int, int]]:
    rows = (out / "attn" / "stats.csv").read_text().splitlines()
    return [tuple(map(int, row.split(",")[:3])) for row in rows[1:]]


def test_stats_rows_stay_one_per_step_layer_and_head_across_a_crash_and_resume(tmp_path):
    """Snapshots every step, a checkpoint every 4: a crash after step 6 leaves rows for steps 5 and 6 that the
    resumed run redoes; the file ends with exactly one row per (step, layer, head)."""
    out = tmp_path / "run"
    overrides = ["train.max_iters=8", "eval.interval=4", "wandb.attn_interval=1", "attn.layers=[1]"]

    def crash_after_6(steps: int) -> bool:
        if steps == 6:
            raise RuntimeError("simulated crash")
        return False

    with pytest.raises(RuntimeError, match="simulated crash"):
        train(tiny_config(out, *overrides), should_stop=crash_after_6)
    assert sorted({k[0] for k in stats_keys(out)}) == [1, 2, 3, 4, 5, 6]
    train(tiny_config(out, *overrides))
    assert stats_keys(out) == [(step, layer, head) for step in range(1, 9) for layer in range(2) for head in range(4)]
    assert sorted(p.name for p in (out / "attn" / "layer_1").iterdir()) == [f"step_{s:06d}.png" for s in range(1, 9)]
    assert not (out / "attn" / "layer_0").exists()  # attn.layers=[1]: only layer 1 is drawn


def test_attn_enabled_false_records_no_attention(tmp_path):
    result = train(tiny_config(tmp_path, "train.max_iters=2", "eval.interval=1", "attn.enabled=false"))
    assert result.attn_seconds == 0 and not (tmp_path / "attn").exists()
    result = train(tiny_config(tmp_path / "on", "train.max_iters=2", "eval.interval=1"))
    assert result.attn_seconds > 0
    assert sorted(p.name for p in (tmp_path / "on" / "attn").iterdir()) == ["explorer", "layer_0", "layer_1", "stats.csv"]
