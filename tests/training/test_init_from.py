"""training/init_from.py: the source a run starts from. train.init_from naming an out_dir that holds best/ and
latest/ starts from best/ (the lowest val loss), with exactly its weights; a resume (the run's out_dir already
holds a checkpoint) reads the run's own latest/. The out_dir is tests/pretrained/test_checkpoint_choice.py's,
whose two checkpoints differ in their weights."""
from __future__ import annotations

import torch

from pretrained.checkpoint import BEST, LATEST
from tests.helpers import tiny_config
from tests.pretrained.test_checkpoint_choice import model_of, run, weights  # noqa: F401  (run: that module's fixture)
from training.init_from import init_source


def test_init_from_an_out_dir_starts_from_best_and_a_resume_from_latest(run, tmp_path):
    cfg = tiny_config(tmp_path / "new", f"train.init_from={run}")
    source = init_source(cfg, latest=None)
    assert source.folder == run / BEST
    model = source.build_for(source.config)
    assert torch.equal(weights(model), weights(model_of(2)))
    assert model.training and all(p.requires_grad and p.dtype == torch.float32 for p in model.parameters())
    resumed = init_source(cfg, latest=run / LATEST)  # out_dir already holds a checkpoint: the run's own latest/
    assert resumed.folder == run / LATEST
