"""The in-context-learning score as `evaluate()` reports it (val/icl_score, icl.csv, the eval line), recomputed
from raw logits: the mean over every val window (and every process) of the loss at each position, then the
mean over the last tenth minus the mean over the tenth around 10% of the window."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from data.loader import BatchLoader
from data.prepare import prepare_data
from data.shards import SplitFiles
from model import GPT
from pretrained.checkpoint import load_model, save_model
from tests.helpers import prepared_shakespeare_dir, tiny_config
from tests.training.test_parallel_ddp_in_process import EVAL_RANK_1, two_processes
from training.evaluate import EVAL_SEED_OFFSET, evaluate
from training.plan import with_vocab_size
from training.runtime import Runtime

ITERS = 3
BATCH = 4
# tiny.yaml's block_size is 32: a width of 32 // 10 = 3 positions, the early ones centred on position 3
EARLY, LATE = [2, 3, 4], [29, 30, 31]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return prepared_shakespeare_dir(tmp_path_factory.mktemp("data"))


pytestmark = pytest.mark.usefixtures("data_env")


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory, data_dir):
    """An untrained tiny model saved to disk (what rank 1 loads) and read back; its config and prepared data."""
    root = tmp_path_factory.mktemp("eval")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNGPT_DATA_DIR", str(data_dir))
        cfg = tiny_config(root / "run", f"eval.iters={ITERS}", f"eval.batch_size={BATCH}")
        prepared = prepare_data(cfg.data, quiet=True)
    torch.manual_seed(3)
    save_model(GPT(with_vocab_size(cfg, cfg.model, prepared.tokenizer.vocab_size)), root / "ckpt")
    model, _ = load_model(root / "ckpt")
    return root, model, cfg, prepared


def icl_by_hand(model: GPT, prepared, cfg, ranks: list[int], world_size: int) -> float:
    """The score of every val window the processes `ranks` of `world_size` draw: the negative log-probability
    of each target from the logits in float64, averaged over windows per position, then late minus early."""
    per_position, windows = torch.zeros(model.config.block_size, dtype=torch.float64), 0
    for rank in ranks:
        loader = BatchLoader(SplitFiles(prepared.split_paths("val"), prepared.dtype), model.config.block_size, BATCH,
                             seed=cfg.seed + EVAL_SEED_OFFSET, rank=rank, world_size=world_size)
        for _ in range(cfg.eval.iters):
            x, y = loader.next_batch()
            with torch.no_grad():
                logits = model(x, y)[0].double()
            logp = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
            nll = -logp.gather(-1, y[..., None])[..., 0]  # (B, T)
            per_position += nll.sum(dim=0)
            windows += x.shape[0]
    mean = per_position / windows
    return (sum(mean[i].item() for i in LATE) / len(LATE)) - (sum(mean[i].item() for i in EARLY) / len(EARLY))


def test_one_process_reports_the_score_of_the_mean_loss_at_each_position(saved_model):
    _, model, cfg, prepared = saved_model
    got = evaluate(model, cfg, prepared, Runtime(device=torch.device("cpu"), autocast_dtype=None),
                   model.config.block_size)
    want = icl_by_hand(model, prepared, cfg, [0], 1)
    assert got["icl_score"] == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert abs(want) > 1e-3  # a score summed over the windows instead of averaged would be 12x this one


def test_two_processes_report_the_score_over_both_processes_windows(saved_model, tmp_path):
    root, model, cfg, prepared = saved_model
    rank0, rank1 = two_processes(tmp_path, lambda rt: evaluate(model, cfg, prepared, rt, model.config.block_size),
                                 EVAL_RANK_1, str(root / "ckpt"), str(root / "run"), str(ITERS))
    want = icl_by_hand(model, prepared, cfg, [0, 1], 2)
    assert rank0["icl_score"] == rank1["icl_score"]  # every process logs the same number
    assert rank0["icl_score"] == pytest.approx(want, rel=1e-5, abs=1e-6)
    own_halves = [icl_by_hand(model, prepared, cfg, [r], 2) for r in (0, 1)]
    assert all(abs(half - want) > 1e-4 for half in own_halves), (own_halves, want)  # a process's own half differs
