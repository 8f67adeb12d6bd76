"""benchmarks/gpu_check.sh runs only on a lent GPU machine, for minutes that cannot be had twice: its commands
are checked here, on any machine, before they get there. Every train.py run's config and overrides load;
sample.py's flags pass its checks; every benchmark's parser reads the arguments the script gives it."""
from __future__ import annotations

import argparse
import runpy
import shlex
import sys

import pytest

from tests.helpers import REPO

SCRIPT = REPO / "benchmarks" / "gpu_check.sh"


def step_commands() -> list[tuple[str, list[str]]]:
    """(step name, argv after the interpreter) of every `step NAME LIMIT "$PY" ...` line of the script."""
    lines = SCRIPT.read_text().replace("\\\n", " ").splitlines()
    commands = []
    for start, line in enumerate(lines):
        if not line.strip().startswith("step ") or '"$PY"' not in line:
            continue
        end = start + 1
        while True:  # a quoted argument (python -c '...') may run over several lines: take lines until it closes
            try:
                words = shlex.split("\n".join(lines[start:end]))  # step NAME LIMIT $PY ARGS...
                break
            except ValueError:
                end += 1
        command = " ".join(words)
        name, interpreter, args = words[1], words[3], words[4:]
        assert interpreter == "$PY", command
        commands.append((name, args))
    return commands


COMMANDS = step_commands()


def script_of(args: list[str]) -> tuple[str, list[str]]:
    """The script a command runs and its own arguments (through `-m torch.distributed.run ... train.py`)."""
    if args[:2] == ["-m", "torch.distributed.run"]:
        first = next(i for i, a in enumerate(args) if a.endswith(".py"))
        return args[first], args[first + 1:]
    if args[0] == "-m":
        return args[1], args[2:]
    if args[0] == "-c":
        return "-c", []
    return args[0], args[1:]


def test_the_script_has_the_steps_it_documents():
    scripts = {script_of(args)[0] for _, args in COMMANDS}
    assert {"train.py", "sample.py", "benchmarks/train_throughput.py", "benchmarks/sample_vs_hf.py",
            "benchmarks/sample_speed.py", "benchmarks/quality_vs_time.py", "data.prepare", "pytest"} <= scripts
    assert len(COMMANDS) >= 12


@pytest.mark.parametrize("name, args", [c for c in COMMANDS if script_of(c[1])[0] == "train.py"],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_train_runs_load_their_config(name, args, monkeypatch):
    from training.config import load_run_config
    _, rest = script_of(args)
    config, overrides = rest[0], rest[1:]
    assert (REPO / config).is_file(), config
    monkeypatch.chdir(REPO)
    cfg = load_run_config(config, overrides)  # raises a UserError naming any bad key or value
    assert cfg.out_dir.startswith("/tmp/"), "a check run writes outside the repository"


@pytest.mark.parametrize("name, args", [c for c in COMMANDS if script_of(c[1])[0] == "sample.py"],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_sample_runs_pass_the_flag_checks(name, args):
    import sample
    flags = sample.parse_args(script_of(args)[1])
    sample.check_flags(flags)


class Parsed(Exception):
    """Raised by the patched parse_known_args (which parse_args calls) with its namespace and left-over
    arguments: the script stops before doing any work."""


@pytest.mark.parametrize("name, args", [c for c in COMMANDS if script_of(c[1])[0].startswith("benchmarks/")],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_benchmark_arguments_parse(name, args, monkeypatch):
    """The script's own argparse parser reads the arguments (a misspelt flag would be left over); the script is
    stopped right after parsing, before any work."""
    script, rest = script_of(args)
    parse_known_args = argparse.ArgumentParser.parse_known_args  # what parse_args calls too

    def parse_then_stop(self, *a, **kw):
        raise Parsed(*parse_known_args(self, *a, **kw))
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", parse_then_stop)
    monkeypatch.setattr(sys, "argv", [script, *rest])
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    with pytest.raises(Parsed) as parsed:
        runpy.run_path(str(REPO / script), run_name="__main__")
    namespace, left_over = parsed.value.args
    assert [a for a in left_over if a.startswith("-") or "=" not in a] == []  # section.key=value: an override
    given = {a.split("=", 1)[0].lstrip("-").replace("-", "_") for a in rest if a.startswith("--")}
    assert given <= set(vars(namespace))
