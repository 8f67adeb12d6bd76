"""The bad-input matrix of train.py and sample.py once more, through their `main` in this process: the same
arguments, the same one line and exit status 2. tests/cli/test_bad_inputs.py runs every case as a real command
line; this pass is fast (no interpreter start-up per case) and lets tools that watch this process, like mutmut
(docs/testing.md), see which code each case reaches. Cases that need a separate process (a file-size limit,
a shadowed package on PYTHONPATH) are left to the command-line pass."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch

from tests.bad_input_cases import CASES, DAMAGE, MARKER, Case, write_files
from tests.helpers import TINY, prepared_shakespeare_dir

IN_PROCESS = [c for c in CASES if c.prog in ("train.py", "sample.py") and c.outcome == "error"
              and c.file_size_limit is None and "PYTHONPATH" not in c.env]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return prepared_shakespeare_dir(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, data_dir) -> Path:
    out = tmp_path_factory.mktemp("trained")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNGPT_DATA_DIR", str(data_dir))
        mp.setenv("WANDB_MODE", "disabled")
        from training.config import load_run_config
        from training.trainer import train
        train(load_run_config(TINY, [f"out_dir={out}", "train.max_iters=2", "eval.interval=2", "attn.enabled=false",
                                     "train.peak_flops=1e12"]))
    return out


def fill(text: str, values: dict[str, str]) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), m.group(0)), text)


@pytest.mark.parametrize("case", IN_PROCESS, ids=[c.id for c in IN_PROCESS])
def test_bad_input_in_process(case: Case, tmp_path, data_dir, trained_run, monkeypatch, capsys):
    if case.needs_no_gpu and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU, so the input is not bad here")
    write_files(case.files, tmp_path)
    (tmp_path / "a_file").write_text("a regular file, not a folder\n")
    values = {"tmp": str(tmp_path), "out": str(tmp_path / "out"), "run": str(tmp_path / "run"),
              "file": str(tmp_path / "a_file"), "data": str(data_dir), "deep": "[" * 1000 + "]" * 1000}
    if any("{run}" in a for a in case.args):
        shutil.copytree(trained_run, tmp_path / "run")
        if case.damage is not None:
            DAMAGE[case.damage][1](tmp_path / "run" / "latest", tmp_path / MARKER)
    monkeypatch.setenv("ATTNGPT_DATA_DIR", str(data_dir))
    monkeypatch.setenv("WANDB_MODE", "disabled")
    for key, value in case.env.items():
        monkeypatch.setenv(key, fill(value, values))
    monkeypatch.chdir(Path(__file__).resolve().parents[2])  # relative paths as the command line sees them
    import sample
    import train
    main = train.main if case.prog == "train.py" else sample.main
    with pytest.raises(SystemExit) as e:
        main([fill(a, values) for a in case.args])
    assert e.value.code == 2
    lines = [line.strip() for line in re.split(r"[\r\n]", capsys.readouterr().err) if line.strip()]
    assert lines and lines[-1].startswith(f"{case.prog}: error: "), lines[-3:]
    for fragment in case.expect:
        assert fragment in lines[-1], (fragment, lines[-1])
    assert not (tmp_path / MARKER).exists()
