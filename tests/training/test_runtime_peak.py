"""An MFU is at most 100% (training/runtime.py: PeakFlops): a peak measured low is measured again, once; while
the run is still faster its fastest rate stands in, and the figure is marked as an upper bound, said once."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import training.trainer as trainer
from tests.helpers import shakespeare_data_dir, tiny_config
from training.runtime import PeakFlops
from training.trainer import train

QUIET = ("attn.enabled=false", "wandb.mode=disabled", "eval.interval=100")


@settings(max_examples=200, deadline=None)
@given(given_peak=st.one_of(st.none(), st.floats(1e3, 1e15)), first=st.floats(1e3, 1e15),
       again=st.floats(1e3, 1e15), rates=st.lists(st.floats(1e3, 1e15), min_size=1, max_size=20))
def test_an_mfu_is_never_above_one_and_exact_until_the_peak_proves_low(given_peak, first, again, rates):
    """Any peak (given or measured, and its second measure) and any sequence of rates: every MFU is in (0, 1]
    and is the rate over the largest of the peak known then (measured again once a rate passed the first
    measure; a given one only taken) and every rate so far; the note is said once, exactly when a rate passed
    that peak."""
    measures, said, calls = iter([first, again]), [], []

    def measure():
        calls.append(1)
        return next(measures)
    peak = PeakFlops(given_peak, measure, said.append)
    for i, rate in enumerate(rates):
        mfu = peak.mfu(rate)
        passed = any(r > first for r in rates[:i + 1])
        known = given_peak if given_peak is not None else (max(first, again) if passed else first)
        assert 0 < mfu <= 1 and mfu == rate / max(known, *rates[:i + 1])
    assert len(calls) == (0 if given_peak is not None else 1 + any(r > first for r in rates))
    known = given_peak if given_peak is not None else (max(first, again) if len(calls) == 2 else first)
    assert peak.bounded == any(r > known for r in rates) and len(said) == int(peak.bounded)
    if said:
        assert "MFU is shown against the run's fastest rate" in said[0] and "upper bound" in said[0]
        # it names where the peak it passed came from
        source = "given as train.peak_flops" if given_peak is not None else "measured at start and again"
        assert f"more than the peak {source} (" in said[0]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return shakespeare_data_dir(tmp_path_factory.mktemp("data"))


def metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("measured_again", [1e3, 1e18])
def test_a_peak_measured_too_low_never_shows_an_mfu_above_100(tmp_path, data_dir, monkeypatch, measured_again):
    """Through train(): the start-up measure reads 1e3 FLOP/s (the machine busy). Measured again at 1e18 the
    run's MFU is against that, exactly, unmarked; measured again just as low, the bar shows '<=' and at most
    100%, metrics.jsonl never more than 1, and the log says why once."""
    monkeypatch.setenv("ATTNGPT_DATA_DIR", str(data_dir))
    measures = iter([1e3, measured_again])
    monkeypatch.setattr(trainer, "measure_peak_flops", lambda device, dtype: next(measures))
    shown, written = [], []
    monkeypatch.setattr(trainer.RunLogger, "progress", lambda self, n, postfix: shown.append(postfix["mfu"]))
    real_write = trainer.RunLogger.write
    monkeypatch.setattr(trainer.RunLogger, "write", lambda self, line: written.append(line) or real_write(self, line))
    out = tmp_path / "run"
    cfg = tiny_config(out, "train.max_iters=4", "train.log_interval=1", *QUIET)
    cfg.train.peak_flops = None  # measured, as a run without train.peak_flops does
    result = train(cfg)
    rows = [r for r in metrics(out) if "mfu" in r]
    assert rows and all(0 < r["mfu"] <= 1 for r in rows)
    assert all(float(s.lstrip("<=").rstrip("%")) <= 100.0 for s in shown)
    notes = [line for line in written if "more than the peak measured at start and again" in line]
    if measured_again == 1e18:
        flops = result.model.flops_per_token(result.model.config.block_size)
        assert all(r["mfu"] == pytest.approx(r["tokens_per_s"] * flops / 1e18, rel=1e-9) for r in rows)
        assert not notes and not any(s.startswith("<=") for s in shown)
    else:
        assert len(notes) == 1 and all(s.startswith("<=") for s in shown)


def test_a_given_peak_too_low_is_bounded_not_measured(tmp_path, data_dir, monkeypatch):
    """train.peak_flops=1e3: never replaced by a measure; every MFU shown is an upper bound, at most 100%."""
    monkeypatch.setenv("ATTNGPT_DATA_DIR", str(data_dir))
    monkeypatch.setattr(trainer, "measure_peak_flops", lambda device, dtype: pytest.fail("a given peak was measured"))
    out = tmp_path / "run"
    train(tiny_config(out, "train.max_iters=3", "train.log_interval=1", "train.peak_flops=1e3", *QUIET))
    rows = [r for r in metrics(out) if "mfu" in r]
    assert rows and all(0 < r["mfu"] <= 1 for r in rows)
    assert max(r["mfu"] for r in rows) == 1.0  # the fastest window is the peak it stands in for
