"""The bad-input matrix (tests/bad_input_cases.py, documented in docs/bad_inputs.md): every case through the
real command line -- one clear line, exit status 2, no traceback; planted pickles never run; a failed
save leaves the previous checkpoint loadable."""
from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest
import torch

from tests.bad_input_cases import CASES, DAMAGE, DOC, MARKER, Case, render_markdown, write_files
from tests.helpers import TINY, prepared_shakespeare_dir, run_cli

CHECKPOINT_STEP = 2


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return prepared_shakespeare_dir(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, data_dir) -> Path:
    """tiny.yaml trained for 2 steps: latest/ and best/ at step 2 (what the checkpoint cases damage)."""
    out = tmp_path_factory.mktemp("trained")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNGPT_DATA_DIR", str(data_dir))
        mp.setenv("WANDB_MODE", "disabled")
        from training.config import load_run_config
        from training.trainer import train
        train(load_run_config(TINY, [f"out_dir={out}", f"train.max_iters={CHECKPOINT_STEP}", "eval.interval=2",
                                     "attn.enabled=false", "train.peak_flops=1e12"]))
    return out


def test_the_matrix_is_large_and_the_doc_is_generated_from_it():
    assert len(CASES) >= 30 and len({c.id for c in CASES}) == len(CASES)
    assert {c.prog for c in CASES} == {"train.py", "data.prepare", "sample.py", "convert.py"}
    assert {c.kind for c in CASES} >= {"flags", "config", "environment", "data", "checkpoint", "prompt"}
    assert DOC.is_file() and DOC.read_text(encoding="utf-8") == render_markdown(), \
        "docs/bad_inputs.md is out of date: run `python -m tests.bad_input_cases`"


@pytest.mark.parametrize("args, fragment", [
    (["train.py", "configs/tiny.yaml", "train.max_itres=5"], "did you mean 'train.max_iters'"),
    (["train.py", "configs/tiny.yaml", "train.batch_size=0"], "batch_size"),
    (["sample.py", "--temperature", "-1"], "--temperature must be >= 0.0"),
    (["sample.py", "--compile", "--no-kv-cache"], "drop --no-kv-cache"),
])
def test_config_and_flag_errors_come_before_torch_is_imported(args, fragment):
    """A typo costs a fraction of a second, not torch's seconds of import: -X importtime lists every module
    the process imported, and torch is not among them."""
    proc = run_cli(["-X", "importtime", *args])
    imported = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 2 and len(errors) == 1 and fragment in errors[0], proc.stderr[-2000:]
    assert "yaml" in imported or args[0] == "sample.py"  # the listing is there
    assert "torch" not in imported


def uses(case: Case, name: str) -> bool:
    return any(f"{{{name}}}" in text for text in (*case.args, *case.env.values()))


def fill(text: str, values: dict[str, str]) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), m.group(0)), text)


def limit_file_size(limit: int):
    def preexec() -> None:
        import resource
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # Python ignores SIGXFSZ: writes get EFBIG
    return preexec


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case, tmp_path, data_dir, trained_run):
    if case.needs_no_gpu and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU, so the input is not bad here")
    if case.file_size_limit is not None and sys.platform == "win32":
        pytest.skip("RLIMIT_FSIZE is POSIX")
    write_files(case.files, tmp_path)
    (tmp_path / "a_file").write_text("a regular file, not a folder\n")
    values = {"tmp": str(tmp_path), "out": str(tmp_path / "out"), "run": str(tmp_path / "run"),
              "file": str(tmp_path / "a_file"), "data": str(data_dir), "deep": "[" * 1000 + "]" * 1000}
    marker = tmp_path / MARKER
    if uses(case, "run"):
        shutil.copytree(trained_run, tmp_path / "run")
        if case.damage is not None:
            DAMAGE[case.damage][1](tmp_path / "run" / "latest", marker)
    argv = [case.prog] if case.prog != "data.prepare" else ["-m", "data.prepare"]
    env = {"ATTNGPT_DATA_DIR": str(data_dir), "OMP_NUM_THREADS": "1",
           **{k: fill(v, values) for k, v in case.env.items()}}
    kwargs = {"preexec_fn": limit_file_size(case.file_size_limit)} if case.file_size_limit else {}
    proc = run_cli([*argv, *(fill(a, values) for a in case.args)], env_extra=env, timeout=120, **kwargs)

    stderr = proc.stderr
    assert "Traceback" not in stderr and "Traceback" not in proc.stdout, stderr[-3000:]
    lines = [line.strip() for line in re.split(r"[\r\n]", stderr) if line.strip()]
    if case.outcome == "warning":
        assert proc.returncode == 0, (proc.returncode, stderr[-3000:])
        line = next((x for x in lines if x.startswith("warning:")), None)
        assert line is not None and not any(": error:" in x for x in lines), stderr[-3000:]
    else:
        assert proc.returncode == 2, (proc.returncode, stderr[-3000:])
        errors = [x for x in lines if ": error:" in x]
        # one error line, and the last: a progress bar or eval lines may come before it, nothing after
        assert len(errors) == 1 and lines[-1].startswith(f"{case.prog}: error: "), stderr[-3000:]
        line = lines[-1]
    for fragment in case.expect:
        assert fragment in line, (fragment, line)
    assert not marker.exists(), "a planted pickle was unpickled: code from the checkpoint ran"
    if case.prog == "convert.py":  # nothing half-written: no OUT_DIR, no temporary folder beside it
        assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*")), list(tmp_path.iterdir())
    if case.intact or (case.prog == "train.py" and uses(case, "run") and case.damage is None):
        # nothing lost: the run's checkpoint still loads, at its step, with no temporary folders left over
        from pretrained.checkpoint import load_model
        from training.checkpoint import load_train_state
        run = tmp_path / "run"
        load_model(run / "latest")
        load_model(run / "best")
        assert load_train_state(run / "latest")["step"] == CHECKPOINT_STEP
        assert not list(run.glob(".*.tmp")) and not [p for p in run.glob(".*.old") if p.is_dir()]
