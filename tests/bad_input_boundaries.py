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


# the rules these cases hold to, for docs/bad_inputs.md (tests/bad_input_cases.py renders them after its intro)
RULES_DOC = [
    "## The rules at the boundaries",
    "",
    "Each is written once, where the data enters, and tested on generated inputs as well as the cases below.",
    "",
    "- **Where a command that reads a run may write** (`common/paths.py`). `sample.py --dump-dir` and `convert.py`'s "
    "`OUT_DIR` are refused, in one line, inside a run or a model folder: one that holds (itself, or a folder above "
    "it; symbolic links followed) `.train.lock`, a `config.yaml` beside a `latest/` or `best/` holding weights, or a checkpoint's or "
    "model's files (`model.safetensors`, `model.safetensors.index.json`, `train_state.pt`, `fsdp_state.pt`). "
    "`convert.py --force` replaces only a folder convert.py wrote itself (it holds `.attngpt-convert.json` and no "
    "subfolder), and never the source of the conversion, a folder inside it or one holding it. Tests: "
    "`common/test_paths_write_boundaries.py`, `pretrained/hf/test_export.py` (convert.py's `OUT_DIR` rule).",
    "- **Every file the product writes** (`common/writes.py`: `write_file`, `append_text`, `owning`). Checkpoints, "
    "configs, metrics, stats.csv, heatmaps, dumps, the explorer, prepared shards and converted folders are all "
    "written through it: to a new temporary name beside the target (created exclusively: never an existing file "
    "or a link), fsynced, renamed over the target, the folder fsynced. A link at the target is replaced, never "
    "written through; a log (metrics.jsonl, stats.csv) that is a link is refused, and one whose last line a "
    "crash cut short gets a newline before the next row. Nothing is written inside a run or model folder that "
    "the process does not write: train.py refuses an out_dir inside another run's folder (its `latest/`, say, "
    "which that run's next save replaces) before anything is created. Tests: `common/test_writes.py`.",
    "- **A path is UTF-8 text** (`common/paths.py: expand_path`, where every path setting and path flag enters). "
    "Bytes that are not UTF-8 reach a command as lone surrogates, which no config.yaml, config.json or log "
    "could record: such a path is refused in one line naming the setting, before anything is read or "
    "written. Tests: `common/test_paths_write_boundaries.py`.",
    "- **Readers of prepared data** (`data/prepared.py: reading`, `data/prepare.py: _no_readers`). A training run "
    "holds a shared lock on its data folder's meta.json (opened read-only) while it trains; `data.prepare` "
    "(with `--force`, or after the corpus changed) refuses in one line to remake a folder a run is reading, "
    "instead of deleting the shards the run opens for every batch. Tests: `data/test_prepared.py`.",
    "- **A run's own files round-trip** (`training/trainer.py: build`). A run's config.yaml records the model as "
    "resolved (the tokenizer's vocabulary, an init_from source's shape), so `train.py RUN/config.yaml "
    "out_dir=RUN` resumes it. Tests: `training/test_run_config_roundtrip.py`.",
    "- **What an override's text means** (`common/config_io.py`). For a setting that takes a "
    "string (`out_dir`, the data paths and names, `device`, `train.init_from`, `wandb.*`, `attn.probe_text`, the "
    "choices such as `dtype`) the value is the literal text: `out_dir=runs/exp #2` is the folder `runs/exp #2`, and "
    "quotes are part of the text. An empty value, `null`, `Null`, `NULL` and `~` are null for every key: "
    "`attn.probe_text=null` is None (a probe text that is the word null goes in the config file, quoted), and a "
    "setting that needs a string refuses null. `data.path` and `data.data_files` read a YAML list when the text "
    "starts with `[`; `train.compile` reads true and false. Every other setting is read as YAML, and refused, "
    "naming the key, when YAML would drop part of the text (a comment, `#...`) or fold a line break into a space. "
    "A key that is not a setting keeps its text and is refused by name. `python -m data.prepare` reads only the "
    "overrides of `data.*` and `model.block_size`. Tests: `common/test_config_io_overrides.py`.",
    "- **`~` is the home folder** in every path setting, from the config file or an override: `out_dir`, "
    "`data.path`, `data.data_files`, `data.name` (a local dataset folder), `train.init_from`; and in the config "
    "path and the path flags of sample.py and convert.py. The command a finished run prints to sample it is "
    "shell-quoted.",
    "- **Symbolic links in a run.** `out_dir` may be a link, and so may `out_dir/attn` (heatmaps and `stats.csv` go "
    "where it points). `latest/` and `best/` (and `.latest.tmp`, `.latest.old`, ...) may not: every save renames "
    "the folder aside and a new one into its place, so a run refuses such a link at its start, before any "
    "training, naming it.",
    "- **What the prepare fingerprint compares** (`data/prepare.py`, `data/sources.py`). For each local file of the "
    "corpus: its name, size and the sha256 of every byte (0.16 s per 100 MB on a 2-core machine: "
    "`benchmarks/fingerprint_cost.py`); the corpus's identity (local text files by their absolute paths, a hub "
    "dataset by its name, config, split, column, data_files and max_docs), the tokenizer, the split settings and "
    "the token format's version. An edit anywhere in a local file prepares the data again. Not compared: a hub "
    "dataset's content (pass `--force` after it changed), and the shards of a prepared folder, which are checked "
    "for their recorded lengths and for ids inside the vocabulary (every id of a small folder, a sample of a large "
    "one, and every batch the loader draws: `data/shards.py`), not hashed: an edit of a shard that keeps its ids "
    "inside the vocabulary is not seen (`--force` prepares again). Folders fingerprinted when only the first "
    "and last MiB of each file were hashed are prepared again, once (where the data folder is not writable, one "
    "whose files match by those MiB is used as it is, with a warning). Tests: `data/test_prepare_fingerprint.py`.",
    "- **A corpus file that is not what its format says** (`data/source_errors.py`). After a failed read, each local "
    "parquet, json, csv, text or arrow file is opened with its format's reader and the first one refused is named "
    "with the reason, in one line, streamed or not and with any `data.num_proc` (a worker's traceback is "
    "unwrapped to its last line). Tests: `data/test_source_errors.py`.",
    "- **Sampling memory** (`pretrained/memory.py`: `generation_bytes`). Before generating, sample.py checks a lower "
    "bound of what its `--num-samples` need against the device's memory, with the KV cache (the cache, the "
    "prefill) or without it (`--no-kv-cache`: the whole window's activations at every step). Tests: "
    "`pretrained/test_memory.py`.",
    "- **The one printer** (`common/console.py`: `install`, `GuardedStream`). Every command line routes stdout and "
    "stderr through it first thing, so print(), tqdm's bars, W&B's lines and the one-line errors all obey it: text "
    "the stream's encoding cannot hold is written as a backslash escape; a reader that closes the pipe (`| head`) "
    "ends sample.py, convert.py and `data.prepare` quietly with exit status 141; any other failed write "
    "(`>/dev/full`) is one line naming the stream, exit status 2. A training run goes on instead (its out_dir keeps "
    "config.yaml and metrics.jsonl): a closed pipe silently, a full device with one warning, and it exits as it "
    "would have. A failed stream's descriptor is pointed at /dev/null, so the interpreter's last flush does not "
    "fail again. Tests: `common/test_console.py`, `cli/test_console_pipes.py`.",
    "- **What kind of file a path is** (`common/path_kind.py`: `path_kind`). A regular file, a directory, a stream "
    "(a FIFO such as a shell's `<(...)`, a character or block device, a socket), missing, or not reachable "
    "(permission denied, a loop of links), each said as it is. A config file may be a stream, read up to its 1 MB "
    "limit (`common/config_io.py: load_yaml`); a corpus in `data.path` must be a regular file, since it is hashed "
    "and then encoded (`data/sources.py: list_text_files`). Tests: `common/test_path_kind.py`.",
    "- **A write that finds no room** (`common/errors.py`: `out_of_room`). ENOSPC, EDQUOT or EFBIG anywhere in an "
    "error's chain is the disk's fault (full, over its quota, at the file-size limit), named with the file the "
    "error names or the folder being written: `user_errors_exit` applies it to any OSError a command line meets, "
    "and the corpus errors (`data/source_errors.py`) before they would call the failure a load error. Tests: "
    "`common/test_errors.py`.",
    "- **Running out of memory** (`common/errors.py`: `out_of_memory`). Python's, numpy's and torch's out-of-memory "
    "errors name the setting that sized what ran out: `train.batch_size` in train.py, `eval.batch_size` around the "
    "eval (`training/trainer.py: evaluate_and_save`), `--num-samples` in sample.py. Tests: `common/test_errors.py`.",
    "- **Text from a run's files** (`common/json_file.py: parse_json`, `training/logger.py: read_run_id`). Untrusted "
    "JSON (a checkpoint's config.json and its vocabulary, a prepared folder's meta.json, tokenizer files) is "
    "refused when a string holds a lone surrogate, which no stream or file can encode; wandb_run_id.txt must hold "
    "a run id (letters, digits, `-`, `_`). Tests: `common/test_json_file.py`.",
    "- **What the model computes is finite** (`model/gpt.py: GPT._check_finite`, at the end of `GPT._hidden`, the "
    "pass that generation, evaluation and the attention dumps all run). Weights are checked finite when read, but "
    "finite weights can overflow the dtype computed in. Every pass outside training ends with one "
    "`isfinite().all()` of what it returns (logits, or hidden states for the maps); when it fails the pass is "
    "replayed layer by layer and the one line names the first layer whose attention weights or output are not "
    "finite, the dtype and the largest weight there, and the fix (float32, or an earlier checkpoint). The compiled "
    "CPU decode step gets the same check outside its graph; a CUDA graph's steps are not checked (it would wait "
    "for the device at every token). The fused attention kernel returns zeros, not NaN, for a row of NaN scores: "
    "such an overflow reaches no caller as a non-finite number, and the from-scratch path that the maps use names "
    "it. Tests: `model/test_gpt_finite.py`.",
    "- **`train.nonfinite=skip` saves what it claims** (`training/trainer.py: train_loop`). A skipped step still "
    "reaches its eval, checkpoint and stop: when the last steps are skipped the weights of the last applied step "
    "are saved at `train.max_iters`, or the eval that overflows stops the run in one line, the last checkpoint "
    "intact. Tests: `training/test_trainer_nonfinite.py`.",
    "- **An MFU is at most 100%** (`training/runtime.py: PeakFlops.mfu`). A run faster than its peak proves the "
    "peak wrong (measured while other processes held the cores, or `train.peak_flops` given too low): a measured "
    "peak is measured again, once, and while the run is still faster its own fastest rate stands in for the peak; "
    "from then on the progress bar shows the MFU as an upper bound (`mfu=<=97.0%`), said once in the log. Tests: "
    "`training/test_runtime_peak.py`.",
    "- **`auto` decides only on rounds that agree, or on a gain their disagreement cannot explain** "
    "(`training/autotune.py: compare`). Each candidate's fastest round must be confirmed by another of its rounds "
    "within `ROUND_NOISE` (1.25x); otherwise the load changed while they were timed, by up to the rounds' spread, "
    "and the comparison keeps its baseline (float32 eager, or eager for compile), the safe default, its summary "
    "saying so with the spread; unless the fastest candidate beat the baseline by more than that spread times "
    "`MIN_GAIN` (1.05), more than any such change of load explains: then it is kept, and the summary says why. "
    "Tests: `training/test_autotune_rounds.py`.",
    "",
]
