"""Which steps a run writes to metrics.jsonl: the first, every train.log_interval-th and the last."""
from __future__ import annotations

import json

import pytest

from tests.helpers import prepared_shakespeare_dir, tiny_config
from training.trainer import train


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return prepared_shakespeare_dir(tmp_path_factory.mktemp("data"))


pytestmark = pytest.mark.usefixtures("data_env")


def _logged_steps(out) -> list[int]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [row["step"] for row in rows if "train/loss" in row]


def test_the_train_loss_is_logged_after_the_first_step_every_log_interval_steps_and_the_last(tmp_path):
    """log_interval 3 over 7 steps, stopped after 4 and resumed: the first run logs after steps 1 and 3
    (counted from 1); the resumed one after its own first step (5), then on the same grid (6) and the last (7)."""
    quiet = ("attn.enabled=false", "wandb.mode=disabled", "train.log_interval=3", "eval.interval=4", "eval.iters=1")
    out = tmp_path / "run"
    train(tiny_config(out, "train.max_iters=7", *quiet), should_stop=lambda steps: steps == 4)
    assert _logged_steps(out) == [1, 3]
    train(tiny_config(out, "train.max_iters=7", *quiet))
    assert _logged_steps(out) == [1, 3, 5, 6, 7]


def test_each_logged_rate_is_over_a_window_no_longer_than_the_run(tmp_path):
    """tokens_per_s is a window's tokens over its seconds, the time evals took left out: so each window's
    seconds (its tokens over the rate) fit in the whole call's wall time, evals between logs included."""
    import time
    out = tmp_path / "run"
    cfg = tiny_config(out, "train.max_iters=6", "train.log_interval=3", "eval.interval=2", "eval.iters=1",
                      "attn.enabled=false", "wandb.mode=disabled")
    t0 = time.perf_counter()
    train(cfg)
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    logged = [row for row in rows if "train/loss" in row]
    assert [row["step"] for row in logged] == [1, 3, 6]
    tokens_per_step = cfg.train.batch_size * cfg.train.grad_accum * cfg.model.block_size
    for row, steps in zip(logged, (1, 2, 3)):  # the steps each window holds
        seconds = tokens_per_step * steps / row["tokens_per_s"]
        assert 0 < seconds <= wall, (row, wall)
