"""More of the bad-input matrix (tests/bad_input_cases.py adds them to its table): the boundaries where data
enters -- where a command that reads a run may write (convert.py's OUT_DIR, sample.py's --dump-dir: never into a
run, a checkpoint or the source), what an override's text means, a run's checkpoint folders that are symbolic
links, corpus files that are not what their format says (streamed or not, in worker processes or not), a config
path that is a folder, and the memory of sampling without the KV cache. Each case runs through the real command
line like the others; the cases that touch {run} also check that its checkpoint still loads, unchanged."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable


def _symlinked(name: str) -> Callable[[Path, Path], None]:
    """run_dir/name moved to run_dir/real_<name> and a symbolic link left in its place (damage gets run/latest)."""
    def damage(latest: Path, marker: Path) -> None:
        folder = latest.parent / name
        real = latest.parent / f"real_{name}"
        folder.rename(real)
        os.symlink(real.name, folder)
    return damage


BOUNDARY_DAMAGE: dict[str, tuple[str, Callable[[Path, Path], None]]] = {
    "latest_symlink": ("out_dir/latest is a symbolic link to a checkpoint folder beside it", _symlinked("latest")),
    "best_symlink": ("out_dir/best is a symbolic link to a checkpoint folder beside it", _symlinked("best")),
}

GOOD_JSONL = "".join(json.dumps({"text": f"document {i}: some words of text"}) + "\n" for i in range(50))
NOT_JSON = "this is plain text, not JSON Lines\n"
INSIDE = "and a reader never writes into one"


def boundary_cases(Case: Any, TRAIN: tuple[str, ...], RESUME: tuple[str, ...]) -> list[Any]:  # noqa: N803
    jsonl = {"good.jsonl": GOOD_JSONL, "bad.jsonl": NOT_JSON}
    hub_jsonl = ("configs/tiny.yaml", "data.source=hub", "data.name=json",
                 "data.data_files=[{tmp}/good.jsonl,{tmp}/bad.jsonl]", "--quiet")
    return [
        # --- convert.py: OUT_DIR never over a run, a checkpoint or the source ----------------------------------
        Case("convert-force-over-latest", "convert.py", "checkpoint",
             "to-hf --force with OUT_DIR a run's latest/ (the checkpoint a resume needs)",
             ("to-hf", "{run}/best", "{run}/latest", "--force"),
             ("OUT_DIR", "run/latest' is a run or model folder (it holds model.safetensors)", INSIDE,
              "give a new folder outside it"), intact=True),
        Case("convert-force-over-source", "convert.py", "checkpoint", "to-hf --force with OUT_DIR the source itself",
             ("to-hf", "{run}", "{run}", "--force"),
             ("OUT_DIR", "is the source", "never writes over what it reads", "give a new folder"), intact=True),
        Case("convert-into-run", "convert.py", "checkpoint", "to-hf with OUT_DIR a new folder inside another run",
             ("to-hf", "{run}/best", "{run}/hf"),
             ("OUT_DIR", "run/hf' lies inside the run or model folder", "(it holds .train.lock, a training run's lock)",
              INSIDE), intact=True),
        Case("convert-force-foreign-folder", "convert.py", "environment",
             "to-hf --force over a model folder convert.py did not write (no .attngpt-convert.json)",
             ("to-hf", "{run}", "{tmp}/theirs", "--force"),
             ("--force replaces only a folder convert.py wrote (it holds .attngpt-convert.json", "give a new folder"),
             files={"theirs/config.json": "{}\n", "theirs/notes.txt": "someone else's\n"}),
        # --- sample.py: a dump never goes into a run --------------------------------------------------------------
        Case("sample-dump-into-best", "sample.py", "flags", "--dump-dir a run's best/",
             ("--ckpt", "{run}", "--dump-attn", "all", "--dump-dir", "{run}/best", "--max-new-tokens", "1"),
             ("--dump-dir", "run/best' is a run or model folder (it holds model.safetensors)", INSIDE,
              "pass --dump-dir a folder outside it"), intact=True),
        Case("sample-dump-under-run", "sample.py", "flags", "--dump-dir a new folder inside a run's out_dir",
             ("--ckpt", "{run}", "--dump-attn", "0", "--dump-dir", "{run}/dumps/mine", "--max-new-tokens", "1"),
             ("--dump-dir", "run/dumps/mine' lies inside the run or model folder", "(it holds .train.lock", INSIDE),
             intact=True),
        Case("sample-no-cache-memory", "sample.py", "environment",
             "--no-kv-cache --num-samples far beyond memory (every step runs the whole window)",
             ("--ckpt", "{run}", "--no-kv-cache", "--num-samples", "200000000", "--max-new-tokens", "2"),
             ("not enough memory on cpu for 200000000 sample(s)", "activations of the whole window at every step",
              "lower --num-samples")),
        # --- overrides: YAML only where the key's type needs it --------------------------------------------------
        Case("train-override-comment", "train.py", "config", "a number with a YAML comment after it",
             (*TRAIN, "train.max_iters=10 #ten"),
             ("override 'train.max_iters': its value holds a YAML comment ('#ten')", "which YAML would drop")),
        Case("train-override-folded", "train.py", "config", "a number over two lines (YAML would fold them)",
             (*TRAIN, "train.lr=1e-3\n2"),
             ("override 'train.lr': its value has a line break inside", "fold into a space", "on one line")),
        Case("train-config-is-dir", "train.py", "config", "the config path is a folder", ("{tmp}",),
             ("is a directory", "pass the path to a YAML file in it")),
        # --- a run's checkpoint folders are real folders ----------------------------------------------------------
        *[Case(f"train-{key.replace('_', '-')}", "train.py", "environment", BOUNDARY_DAMAGE[key][0], RESUME,
               (f"run/{name}' is a symbolic link (to 'real_{name}')", f"keeps its {name} checkpoint as a real folder",
                "replace the link by a copy"), damage=key, intact=True)
          for key, name in (("latest_symlink", "latest"), ("best_symlink", "best"))],
        # --- corpus files that are not what their format says ---------------------------------------------------
        Case("prepare-parquet-not-parquet", "data.prepare", "data", "a .parquet file that holds text",
             ("configs/tiny.yaml", "data.source=hub", "data.name=parquet", "data.data_files={tmp}/x.parquet"),
             ("file '", "x.parquet' is not a readable parquet file", "Parquet magic bytes not found",
              "leave it out of data.data_files"), files={"x.parquet": "plain text, not parquet\n" * 20}),
        Case("prepare-jsonl-streamed", "data.prepare", "data",
             "a .jsonl file of plain text after a good one, streamed (read while encoding)",
             (*hub_jsonl, "data.streaming=true"),
             ("bad.jsonl' is not a readable json file (line 1 is not JSON", "leave it out of data.data_files"),
             files=jsonl),
        Case("prepare-jsonl-num-proc", "data.prepare", "data",
             "the same with data.num_proc=2 (datasets converts it in worker processes)",
             (*hub_jsonl, "data.num_proc=2"),
             ("bad.jsonl' is not a readable json file (line 1 is not JSON",), files=jsonl),
        Case("prepare-jsonl-streamed-num-proc", "data.prepare", "data",
             "the same streamed with data.num_proc=2 (attngpt's encoding workers read it)",
             (*hub_jsonl, "data.streaming=true", "data.num_proc=2"),
             ("bad.jsonl' is not a readable json file (line 1 is not JSON",), files=jsonl),
    ]
