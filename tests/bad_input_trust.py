"""More of the bad-input matrix (tests/bad_input_cases.py adds them to its table): the run directory's one
writer, resumes that check what they resume, the environment of a torchrun launch, configs and checkpoints too
large to be real, and files a run cannot write. Each case runs through the real command line like the others.
`more_cases` takes the table's Case type and argument lists, so this module needs nothing from it."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable


# tinyshakespeare's 65 characters; OTHER_65 swaps one of them, so its char tokenizer has the same size
TINY_CHARS = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
OTHER_65 = TINY_CHARS.replace("Z", "é")


def _edit_state(edit: Callable[[dict], None]) -> Callable[[Path, Path], None]:
    def damage(latest: Path, marker: Path) -> None:
        import torch
        path = latest / "train_state.pt"
        state = torch.load(path, weights_only=True)
        edit(state)
        torch.save(state, path)
    return damage


def _moments_of_another_shape(state: dict) -> None:
    import torch
    param_state = state["optimizer"][0]["state"][0]  # the token embedding's AdamW moments, (65, 32)
    param_state["exp_avg"] = torch.zeros(5, 3)
    param_state["exp_avg_sq"] = torch.zeros(5, 3)


def _edit_config(edit: Callable[[dict], None]) -> Callable[[Path, Path], None]:
    def damage(latest: Path, marker: Path) -> None:
        payload = json.loads((latest / "config.json").read_text())
        edit(payload)
        (latest / "config.json").write_text(json.dumps(payload))
    return damage


def _set_model(key: str, value: int) -> Callable[[dict], None]:
    return lambda payload: payload["model"].__setitem__(key, value)


def _in_run_dir(name: str, content: str = "a regular file\n") -> Callable[[Path, Path], None]:
    """Put a regular file at run_dir/name (damage gets run_dir/latest)."""
    def damage(latest: Path, marker: Path) -> None:
        path = latest.parent / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return damage


def _terabyte_config(latest: Path, marker: Path) -> None:
    os.truncate(latest / "config.json", 2**40)  # sparse: a terabyte that takes no disk


def _torch_rng_cut(state: dict) -> None:
    state["rng"]["torch"] = state["rng"]["torch"][:100]


MORE_DAMAGE: dict[str, tuple[str, Callable[[Path, Path], None]]] = {
    "state_moment_shape": ("train_state.pt: AdamW moments of another shape (5, 3) than their parameter (65, 32), "
                           "which the fused AdamW kernel would read past", _edit_state(_moments_of_another_shape)),
    "state_negative_step": ("train_state.pt: step -5", _edit_state(lambda s: s.__setitem__("step", -5))),
    "state_step_beyond": ("train_state.pt: step 1000, beyond train.max_iters=4",
                          _edit_state(lambda s: s.__setitem__("step", 1000))),
    "state_nan_best": ("train_state.pt: best_val NaN", _edit_state(lambda s: s.__setitem__("best_val", float("nan")))),
    "state_rng_cut": ("train_state.pt: the torch RNG state cut to 100 bytes", _edit_state(_torch_rng_cut)),
    "config_huge_vocab": ("config.json: vocab_size 10**12", _edit_config(_set_model("vocab_size", 10**12))),
    "config_huge_block": ("config.json: block_size 10**12", _edit_config(_set_model("block_size", 10**12))),
    "config_deep": ("config.json: n_layer 10**7", _edit_config(_set_model("n_layer", 10**7))),
    "config_terabyte": ("config.json grown to 1 TB (a sparse file)", _terabyte_config),
    "tokenizer_too_big": ("config.json: a tokenizer of 75 characters for a model of vocab_size 65",
                          _edit_config(lambda p: p["tokenizer"].__setitem__("chars", p["tokenizer"]["chars"] + "αβγδεζηθικ"))),
    "attn_is_file": ("out_dir/attn is a regular file", _in_run_dir("attn")),
    "heatmap_dir_is_file": ("out_dir/attn/layer_0 (where heatmaps go) is a regular file", _in_run_dir("attn/layer_0")),
    "latest_old_is_file": ("out_dir/.latest.old is a regular file", _in_run_dir(".latest.old")),
}

TORCHRUN = "torchrun sets them all"
STATS_ROW = "0,0,0,0.5,0.1,1.0,1.0,0.9\n"  # a stats.csv row at step 0, kept by a run that starts at step 0
FULL = 100_000  # the file-size limit (bytes) of the "disk full" cases: files already this big cannot grow

def more_cases(Case: Any, TRAIN: tuple[str, ...], RESUME: tuple[str, ...]) -> list[Any]:  # noqa: N803
    return [
        # --- one writer per run directory ---------------------------------------------------------------------
        Case("train-latest-is-file", "train.py", "environment", "out_dir/latest is a regular file, not a checkpoint",
             TRAIN, ("out/latest' is a file, where the run keeps its latest checkpoint folder", "move or delete it"),
             files={"out/latest": "not a checkpoint\n"}),
        Case("train-latest-old-is-file", "train.py", "environment", MORE_DAMAGE["latest_old_is_file"][0], RESUME,
             ("run/.latest.old' is a file", "move or delete it"), damage="latest_old_is_file", intact=True),
        # --- every file a run writes fails like a checkpoint save ---------------------------------------------
        Case("train-attn-is-file", "train.py", "environment", MORE_DAMAGE["attn_is_file"][0],
             (*RESUME, "attn.enabled=true"), ("could not write", "run/attn' (File exists)",
                                              "the last good checkpoint in", "is intact"),
             damage="attn_is_file", intact=True),
        Case("train-heatmap-dir-is-file", "train.py", "environment", MORE_DAMAGE["heatmap_dir_is_file"][0],
             (*RESUME, "attn.enabled=true"), ("could not write", "attn/layer_0/step_000004.png' (", "is intact"),
             damage="heatmap_dir_is_file", intact=True),
        Case("train-metrics-disk-full", "train.py", "environment",
             "the disk fills up while metrics.jsonl is written (simulated: it is at a 100 kB file-size limit)",
             (*TRAIN, "train.peak_flops=1e12", "attn.enabled=false"),
             ("could not write", "metrics.jsonl' (File too large)", "Free disk space"),
             files={"out/metrics.jsonl": "{}\n" * (FULL // 3 + 1)}, file_size_limit=FULL),
        Case("train-stats-disk-full", "train.py", "environment",
             "the disk fills up while attn/stats.csv is written (simulated: it is at a 100 kB file-size limit)",
             (*TRAIN, "train.peak_flops=1e12", "train.max_iters=2", "eval.interval=2", "eval.iters=1"),
             ("could not write", "attn/stats.csv' (File too large)", "Free disk space"),
             files={"out/attn/stats.csv": "step,layer,head,entropy,sink_mass,mean_distance,decay_gamma,decay_r2\n"
                                          + STATS_ROW * (FULL // len(STATS_ROW) + 1)}, file_size_limit=FULL),
        # --- a resume checks what it resumes ------------------------------------------------------------------
        Case("train-resume-other-split", "train.py", "checkpoint",
             "resuming on other data with the same tokenizer (data.val_fraction changed)",
             (*RESUME, "data.val_fraction=0.2"),
             ("holds a checkpoint trained on other data", "1003854 train / 111540 val tokens",
              "resume with the data it was trained on", "train.init_from=")),
        Case("train-resume-other-corpus", "train.py", "checkpoint",
             "resuming on another corpus whose char vocabulary has the same size (65, one character differs)",
             (*RESUME, "data.source=text", "data.path={tmp}/other.txt"),
             ("trained with another tokenizer (char, 65 characters)", "(the same size, other tokens)",
              "or start a new run from these weights: out_dir=NEW_DIR train.init_from="),
             files={"other.txt": OTHER_65 * 40}),
        *[Case(f"train-resume-{key.replace('_', '-')}", "train.py", "checkpoint", MORE_DAMAGE[key][0], RESUME,
               ("cannot resume from", "train_state.pt' does not fit this run", *fragments, "use another out_dir"),
               damage=key)
          for key, fragments in [
              ("state_moment_shape", ("optimizer 0 (AdamW), tok_emb.weight: exp_avg has shape (5, 3) float32, the "
                                      "parameter (65, 32) float32",)),
              ("state_negative_step", ("step -5 is not a step count",)),
              ("state_step_beyond", ("at step 1000, beyond train.max_iters=4", "raise train.max_iters")),
              ("state_nan_best", ("best_val nan is not a loss",)),
              ("state_rng_cut", ("its RNG states are damaged",)),
          ]],
        # --- the environment of a torchrun launch -------------------------------------------------------------
        Case("train-ddp-no-rank", "train.py", "environment", "WORLD_SIZE=2 without RANK", TRAIN,
             ("WORLD_SIZE=2 is set but RANK is not", TORCHRUN), env={"WORLD_SIZE": "2"}),
        Case("train-ddp-rank-not-int", "train.py", "environment", "RANK=abc", TRAIN,
             ("environment variable RANK='abc' is not an integer", TORCHRUN), env={"RANK": "abc"}),
        Case("train-ddp-rank-too-big", "train.py", "environment", "RANK=2 with WORLD_SIZE=2", TRAIN,
             ("RANK=2 is outside 0..1 (WORLD_SIZE=2)", TORCHRUN),
             env={"WORLD_SIZE": "2", "RANK": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}),
        Case("train-ddp-no-master", "train.py", "environment", "WORLD_SIZE, RANK and LOCAL_RANK but no MASTER_ADDR",
             TRAIN, ("MASTER_ADDR is not", TORCHRUN), env={"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}),
        Case("train-ddp-rank-alone", "train.py", "environment", "RANK=1 without WORLD_SIZE", TRAIN,
             ("RANK=1 is set but WORLD_SIZE is not", TORCHRUN), env={"RANK": "1"}),
        # --- configs ------------------------------------------------------------------------------------------
        Case("train-huge-seed", "train.py", "config", "seed=2**70", (*TRAIN, f"seed={2**70}"),
             ("seed=1180591620717411303424", "must be an integer from 0 to 2**63-1")),
        Case("train-duplicate-key", "train.py", "config", "a YAML config with two `train:` sections", ("{tmp}/dup.yaml",),
             ("'train' is given twice in one mapping (lines 3 and 5)", "keep one of them"),
             files={"dup.yaml": "out_dir: runs/dup\n\ntrain:\n  lr: 1.0e-3\ntrain:\n  max_iters: 5\n"}),
        Case("train-config-too-large", "train.py", "config", "a 1.1 MB config file", ("{tmp}/big.yaml",),
             ("is larger than 1 MB", "is it the right file?"), files={"big.yaml": "# " + "x" * 1_100_000 + "\n"}),
        Case("train-probe-text-chars", "train.py", "config", "attn.probe_text with characters the tokenizer lacks",
             (*TRAIN, "attn.probe_text=naïve ~1", "train.peak_flops=1e12"),
             ("attn.probe_text:", "character(s) the char tokenizer does not know: 'ï', '~', '1'")),
        Case("train-wandb-timeout", "train.py", "config", "wandb.init_timeout=0", (*TRAIN, "wandb.init_timeout=0"),
             ("init_timeout=0.0: must be in (0, 3600] seconds",)),
        # --- sample.py: checkpoints and prompts that cannot be real ------------------------------------------
        *[Case(f"sample-{key.replace('_', '-')}", "sample.py", "checkpoint", MORE_DAMAGE[key][0],
               ("--ckpt", "{run}/latest"), ("latest/config.json' has", *fragments, "Is the config damaged?"), damage=key)
          for key, fragments in [("config_huge_vocab", ("parameters (vocab_size=1000000000000",)),
                                 ("config_huge_block", ("block_size=1000000000000",)),
                                 ("config_deep", ("n_layer=10000000",))]],
        Case("sample-config-terabyte", "sample.py", "checkpoint", MORE_DAMAGE["config_terabyte"][0],
             ("--ckpt", "{run}/latest"), ("latest/config.json' is corrupted or not an attngpt config",
                                         "it is 1.1 TB, more than the 4.0 MB such a file can be",
                                         "pass --ckpt an intact checkpoint"), damage="config_terabyte"),
        Case("train-resume-config-terabyte", "train.py", "checkpoint", MORE_DAMAGE["config_terabyte"][0], RESUME,
             ("cannot resume from", "latest/config.json' is corrupted or not an attngpt config",
              "it is 1.1 TB, more than the 4.0 MB", "use another out_dir"), damage="config_terabyte"),
        Case("sample-tokenizer-too-big", "sample.py", "checkpoint", MORE_DAMAGE["tokenizer_too_big"][0],
             ("--ckpt", "{run}/latest"), ("has 75 tokens but the model only 65", "pass --ckpt an intact checkpoint"),
             damage="tokenizer_too_big"),
        Case("sample-prompt-file-endless", "sample.py", "prompt", "--prompt-file /dev/zero (never ends)",
             ("--ckpt", "{run}", "--prompt-file", "/dev/zero"),
             ("--prompt-file '/dev/zero' holds more than 1,000,000 bytes", "pass a shorter file")),
    ]
