"""The config's path from train() to the first loss, and how often it climbs back into a file it had left.

    python tools/config_path.py [--show] [--without-model-shape]

Traces four runs of configs/tiny.yaml in a temporary folder (a fresh run, one with dtype and compile on
auto, a resume of the fresh one, and a fresh start from it with train.init_from). Every call into a project
file whose arguments (besides self) hold the run's config, one of its sections (model, data, train, eval,
wandb, attn), or a record that carries one (the plan, the run) is a step of the path; the trace stops at the
first training step's loss (the checks a config record makes of its own fields while it is built are not
steps). A step climbs back when it enters a file that the path had already visited and left: a file that is not
on the call stack (a call from a file to itself, or back down into a caller, is not a climb).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import training.step as step_module  # noqa: E402
import training.trainer as trainer  # noqa: E402
from training.config import RunConfig, load_run_config  # noqa: E402


class FirstLoss(Exception):
    pass


def config_types(cfg: RunConfig, model_shape: bool) -> tuple[type, ...]:
    from model.config import ModelConfig
    from training.plan import RunPlan
    sections = {type(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)
                if dataclasses.is_dataclass(getattr(cfg, f.name))}
    return (RunConfig, RunPlan, *(t for t in sections if model_shape or t is not ModelConfig))


def trace(cfg: RunConfig, model_shape: bool = True) -> list[tuple[str, str, bool]]:
    """(file, function, whether the file is on the stack below this call) for each step of the path; with
    model_shape False, a call that receives only the model's shape (ModelConfig) is not a step."""
    types = config_types(cfg, model_shape)
    steps: list[tuple[str, str, bool]] = []

    def holds_config(frame) -> bool:
        code = frame.f_code
        for name in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]:
            value = frame.f_locals.get(name)
            if name in ("self", "cls"):
                continue
            if isinstance(value, types) or (dataclasses.is_dataclass(value) and not isinstance(value, type) and any(
                    isinstance(getattr(value, f.name, None), types) for f in dataclasses.fields(value))):
                return True
        return False

    def profile(frame, event, arg) -> None:
        path = frame.f_code.co_filename
        if event != "call" or not path.startswith(str(ROOT)) or "/.venv/" in path or not holds_config(frame):
            return
        caller = frame.f_back
        if caller is not None and caller.f_code.co_name == "__post_init__" and isinstance(
                caller.f_locals.get("self"), types):
            return  # a config record checking its own fields as it is built: not a step of its path
        below, caller = set(), frame.f_back
        while caller is not None:
            below.add(caller.f_code.co_filename)
            caller = caller.f_back
        steps.append((os.path.relpath(path, ROOT), frame.f_code.co_name, path in below))

    real = step_module.accumulate_gradients

    def first_loss(*args, **kwargs):
        sys.setprofile(None)
        raise FirstLoss

    trainer.accumulate_gradients = first_loss  # the loop's first step: the loss is next
    sys.setprofile(profile)
    try:
        trainer.train(cfg)
    except FirstLoss:
        pass
    finally:
        sys.setprofile(None)
        trainer.accumulate_gradients = real
    return steps


def climbs(steps: list[tuple[str, str, bool]]) -> list[int]:
    """Indices of the steps that enter a file the path had visited and left."""
    seen, previous, found = set(), None, []
    for i, (path, _, on_stack) in enumerate(steps):
        if path != previous and path in seen and not on_stack:
            found.append(i)
        seen.add(path)
        previous = path
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--show", action="store_true", help="print every step of each path")
    parser.add_argument("--without-model-shape", action="store_true",
                        help="follow the run's settings only, not the model's shape (ModelConfig) into model/ "
                             "and pretrained/")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        first = f"{tmp}/fresh"
        trainer.train(load_run_config(ROOT / "configs/tiny.yaml", [f"out_dir={first}", "train.max_iters=2",
                                                             "eval.interval=1000"]))
        runs = {"fresh": [f"out_dir={tmp}/fresh2"],
                "auto": [f"out_dir={tmp}/auto", "dtype=auto", "train.compile=auto"],
                "resume": [f"out_dir={first}", "train.max_iters=4"],
                "init_from": [f"out_dir={tmp}/init", f"train.init_from={first}"]}
        for name, overrides in runs.items():
            steps = trace(load_run_config(ROOT / "configs/tiny.yaml", overrides), not args.without_model_shape)
            back = climbs(steps)
            files = {path for path, _, _ in steps}
            print(f"{name}: {len(files)} files, {len(steps)} steps, climbs back {len(back)}: "
                  f"{', '.join(f'{steps[i][0]}:{steps[i][1]}' for i in back) or 'none'}")
            if args.show:
                for i, (path, function, _) in enumerate(steps):
                    print(f"    {path}:{function}{'  <- climbs back' if i in back else ''}")


if __name__ == "__main__":
    main()
