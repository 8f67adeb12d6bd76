"""benchmarks/int8_sample.py on tiny runs (no speed is asserted): every variant gets a row, float32 agrees with
itself, a train.py run's val data gives every variant a val loss (the float32 one the model's own loss on those
batches), and --save appends one section."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, prepared_shakespeare_dir, run_benchmark

SCRIPT = REPO / "benchmarks" / "int8_sample.py"
NAMES = ["float32", "bfloat16", "int8/float32", "int8/float32 head int8", "int8/bfloat16", "int8/bfloat16 head int8",
         "int8-dynamic/float32", "int8-dynamic/float32 head int8", "int8-dynamic/bfloat16", "int8-dynamic/bfloat16 head int8"]
QUICK = ["--prompt", "4", "--new-tokens", "6", "--rounds", "1", "--threads", "1"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return prepared_shakespeare_dir(tmp_path_factory.mktemp("data"))


def bench(*args: str, data: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled",
           **({"ATTNGPT_DATA_DIR": str(data)} if data else {})}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)


def table_rows(stdout: str) -> dict[str, list[str]]:
    rows = [line.strip("|").split("|") for line in stdout.splitlines() if line.startswith("| ") and "---" not in line]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows[1:]}


def test_a_random_shape_gets_a_row_per_variant():
    done = bench("--shape", "small", *QUICK)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = table_rows(done.stdout)
    assert list(rows) == NAMES
    assert rows["float32"][3:5] == ["1.000", "-"]  # float32 against itself
    assert rows["float32"][1] == rows["bfloat16"][2] == "1.00x"  # each ratio against its own base
    assert all(float(row[0]) > 0 and 0 <= float(row[3]) <= 1 and row[5] == "-" for row in rows.values())
    assert "no val loss: a random model" in done.stdout


def test_a_runs_checkpoint_gets_val_losses_and_save_appends_a_section(trained, data_dir, tmp_path):
    out, model = trained
    results = tmp_path / "RESULTS.md"
    done = run_benchmark(SCRIPT, ["--ckpt", str(out), "--val-batches", "2", "--save", *QUICK], results,
                         env_extra={"OMP_NUM_THREADS": "1", "ATTNGPT_DATA_DIR": str(data_dir)})
    assert done.returncode == 0, done.stderr[-3000:]
    rows = table_rows(done.stdout)
    assert list(rows) == NAMES
    losses = {name: float(row[5]) for name, row in rows.items()}
    assert all(0 < loss < 10 for loss in losses.values())
    # 8-bit weights move a loss of ~4 nats very little
    assert abs(losses["int8/bfloat16"] - losses["bfloat16"]) < 0.1 and abs(losses["int8/float32"] - losses["float32"]) < 0.1
    assert "val loss on the val split of" in done.stdout
    saved = results.read_text()
    assert saved.count("## Int8 decoding (sample.py --quantize)") == 1 and "- Command: `python benchmarks/int8_sample.py" in saved
    assert re.search(r"\| int8-dynamic/float32 head int8 \| [\d.]+ \|", saved)


def test_kernels_times_each_kernel_over_the_blocks_and_the_head():
    done = bench("--shape", "small", "--kernels", "--rounds", "1", "--threads", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = table_rows(done.stdout)
    assert {"bfloat16 F.linear", "int8 (_weight_int8pack_mm)", "int8-dynamic (one-row kernel)"} <= set(rows)
    assert all(float(cell) > 0 for row in rows.values() for cell in row)  # ms and GB/s, blocks and head
    assert "12 block matmuls" in done.stdout  # small's 3 layers x 4, each timed


def test_through_sample_py_runs_each_set_of_flags_once_a_round():
    """--through-sample-py: one row per set of sample.py flags, bfloat16 first, each row's rounds its own processes'
    tokens/s lines, the median and the ratio to bfloat16's made from them, and the median of each round's own
    ratio."""
    done = bench("--shape", "small", "--through-sample-py", "--prompt", "4", "--new-tokens", "3", "--rounds", "2",
                 "--threads", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = table_rows(done.stdout)
    assert list(rows) == ["`--dtype bfloat16`", "`--dtype float32 --quantize int8`",
                          "`--dtype bfloat16 --quantize int8`", "`--dtype float32 --quantize int8-dynamic`"]
    bf16 = float(rows["`--dtype bfloat16`"][0])
    bf16_rounds = [float(v) for v in rows["`--dtype bfloat16`"][3].split(", ")]
    for rate, ratio, paired, rounds in rows.values():
        values = [float(v) for v in rounds.split(", ")]
        assert len(values) == 2 and all(v > 0 for v in values)
        assert abs(float(rate) - (values[0] + values[1]) / 2) <= 0.051  # the median of two
        assert abs(float(ratio.rstrip("x")) - float(rate) / bf16) <= 0.006
        # the median of the two rounds' own ratios
        by_round = (values[0] / bf16_rounds[0] + values[1] / bf16_rounds[1]) / 2
        assert abs(float(paired.rstrip("x")) - by_round) <= 0.006
    assert done.stdout.count("  round: ") == 2
