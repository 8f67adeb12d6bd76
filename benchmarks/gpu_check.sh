#!/usr/bin/env bash
# gpu_check.sh: the GPU checks of attngpt in one run, for a lent CUDA machine (made for one H200; ~7-9 min).
#
#   bash benchmarks/gpu_check.sh            (from anywhere; it cd's to the repository root)
#
# Its commands are checked without a GPU by tests/benchmarks/test_gpu_check.py (configs and overrides load, every
# script's parser reads its arguments): keep each step a single `step NAME LIMIT "$PY" ...` line.
#
# Through the device tool, from the repository root here:
#   run(command="bash benchmarks/gpu_check.sh", carry=["data/cache"], timeout_s=600)
#
# What the GPU machine lacks, and what that asks of the caller:
#   - no network, and neither `datasets` nor `wandb` is installed there. attngpt imports both lazily, so the
#     package imports and trains without them (step 1 checks it), but preparing data needs `datasets`:
#     the prepared data MUST be carried. Carry all of data/cache/ (git-ignored, ~3 MB for tinyshakespeare):
#     data/cache/prepared/ (the bins) AND data/cache/tinyshakespeare/input.txt (resolve_corpus looks for the
#     text, and would try to download it). Prepare it here first if needed: python -m data.prepare configs/small.yaml
#   - the prepared folder's fingerprint holds file names, sizes and sampled content hashes (no absolute
#     paths or mtimes), so the carried copy is recognised and reused as it is.
#   - no tiktoken files: copy GPT-2's BPE cache into data/cache/tiktoken/ before the call (cp $TIKTOKEN_CACHE_DIR/*
#     data/cache/tiktoken/, ~1.5 MB), carried with data/cache; the script points TIKTOKEN_CACHE_DIR there.
#   - the machine's python3 holds PyTorch (no venv); the repository is not pip-installed there: every
#     command runs from the repository root, which puts it on sys.path. PYTHON=... overrides the interpreter.
#
# Steps (each one continues on failure, "FAILED <step>" is logged, the exit status counts the failures;
# each has its own time limit, and all of them share a deadline of GPU_CHECK_BUDGET_S seconds, 540 by default):
#   0. nvidia-smi; torch, CUDA and the GPU as PyTorch sees them
#   1. python -c 'import training.trainer, train, sample' with datasets and wandb absent
#   2. re-stamp the carried prepared data for this machine (see above)
#   3. the CUDA-marked tests: python -m pytest -q -m cuda
#   3b. FSDP2 on the GPU at the 124M shape: configs/gpt2-124m.yaml through a single-process torchrun with
#      train.parallel=fsdp (bf16 params, fp32 reduce), on the carried char data with model.vocab_size=50304,
#      6 steps, one eval, a sharded (DCP) latest/ and consolidated best/ + latest/ in /tmp/fsdp-gpu; then
#      sample.py reads the consolidated checkpoint on CUDA, and decodes 512 tokens in bf16 eagerly and with
#      --compile (whose rule, model.generate.compile_repays, says whether it compiled)
#   4. benchmarks/train_throughput.py at GPT-2 small (124M: vocab 50304, block 1024, 12 layers, 12 heads,
#      width 768, batch 16) on CUDA: nanoGPT's model (benchmarks/nanogpt_reference.py) fp32 eager and as its train.py
#      runs on a GPU (bf16 autocast, compile, fused AdamW) vs attngpt in fp32 and in bf16 autocast with flash SDPA
#      (--sdpa-backend flash: the bf16 variants), eager and torch.compile'd, 3 repeats; appended to RESULTS.md (--save)
#   5. a short configs/small.yaml run on CUDA in bf16 (300 steps, an eval every 100) into /tmp/small-gpu,
#      then its val loss vs wall-clock table (benchmarks/quality_vs_time.py --metrics), appended to RESULTS.md
#   6. benchmarks/sample_speed.py on CUDA in bf16: tokens/s with and without the KV cache at 64/256/1024 tokens
#      of context, ms/token at positions 10 and 1000, cache bytes; appended to RESULTS.md
#   6b. benchmarks/sample_vs_hf.py on CUDA at GPT-2 124M in bf16: attngpt eager and compiled decode vs transformers'
#      generate, identical weights (needs transformers there), beside the limits (bytes/token, HBM bandwidth, matmul
#      floor), and sample.py itself in fresh processes (--through-sample-py: needs GPT-2's BPE files, see below)
#   7. torch.profiler's top 25 CUDA ops of the bf16 compiled 124M training step (for explaining where time goes)
#   8. copy benchmarks/RESULTS.md, the small run's and the FSDP run's metrics.jsonl to $OUT
# Everything, commands included (set -x), is logged to $OUT/gpu_check.log if $OUT is set, else ./gpu_check.log.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
OUT_DIR="${OUT:-.}"
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/gpu_check.log"
PY="${PYTHON:-python3}"
BUDGET="${GPU_CHECK_BUDGET_S:-540}"

export WANDB_MODE=disabled HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
# GPT-2's BPE files, carried (sample_vs_hf --through-sample-py saves its 50304-token model with that tokenizer)
[[ -d data/cache/tiktoken ]] && export TIKTOKEN_CACHE_DIR="$PWD/data/cache/tiktoken"

FAILED=()

# step NAME LIMIT_S CMD...: run CMD with a time limit of min(LIMIT_S, seconds left); log and count a failure
step() {
    { set +x; } 2>/dev/null  # trace the command itself, not this bookkeeping
    local name=$1 limit=$2 left rc
    shift 2
    left=$((BUDGET - SECONDS))
    if ((left < 20)); then
        echo "SKIPPED $name: ${left}s left of the ${BUDGET}s budget"
        FAILED+=("$name (skipped, out of time)")
        set -x
        return 0
    fi
    ((limit > left)) && limit=$left
    echo "=== $name (limit ${limit}s, ${SECONDS}s elapsed) ==="
    set -x
    timeout --kill-after=10 "$limit" "$@"
    { rc=$?; set +x; } 2>/dev/null
    if ((rc != 0)); then
        ((rc == 124 || rc == 137)) && echo "FAILED $name: timed out after ${limit}s" || echo "FAILED $name: exit status $rc"
        FAILED+=("$name")
    fi
    set -x
    return 0
}

main() {
    set -x
    date -u
    step "nvidia-smi" 30 nvidia-smi
    step "torch sees the GPU" 60 "$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda,
"available", torch.cuda.is_available()); print(torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0))'

    # 1. imports without datasets / wandb (they are absent there; made absent here too, to test the same thing)
    step "imports without datasets and wandb" 60 "$PY" -c '
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("datasets", "wandb"):
            raise ImportError(f"{name} is absent on this machine")
sys.meta_path.insert(0, Absent())
import training.trainer, train, sample, data.prepare, model
print("imports OK without datasets and wandb")'

    # 2. the carried prepared data is reused, not prepared again (that would need `datasets`)
    step "carried data reused" 60 "$PY" -m data.prepare configs/small.yaml

    # 3. tests that need a GPU (skipped elsewhere)
    step "pytest -m cuda" 150 "$PY" -m pytest -q -m cuda -p no:cacheprovider

    # 3b. FSDP2 at the 124M shape (the data section points at the carried char data: no datasets/tiktoken needed)
    rm -rf /tmp/fsdp-gpu
    step "fsdp 124M" 120 "$PY" -m torch.distributed.run --standalone --nproc_per_node=1 train.py \
        configs/gpt2-124m.yaml train.parallel=fsdp data.source=tinyshakespeare data.tokenizer=char data.name=null \
        data.config_name=null data.streaming=false data.val_fraction=0.1 data.num_proc=1 model.vocab_size=50304 \
        train.batch_size=8 train.grad_accum=1 train.max_iters=6 train.warmup_iters=2 train.compile=false \
        eval.interval=6 eval.iters=2 attn.layers=[0] wandb.mode=disabled out_dir=/tmp/fsdp-gpu
    step "sample the FSDP checkpoint" 60 "$PY" sample.py --ckpt /tmp/fsdp-gpu --device cuda --prompt "ROMEO:" \
        --max-new-tokens 32
    # eager bf16 decoding of the 124M model as a user runs it (each token a new key length), then --compile
    # (compile_repays decides: its note says why it compiles or not); their tokens/s lines, compile included
    step "sample.py bf16 eager 124M" 60 "$PY" sample.py --ckpt /tmp/fsdp-gpu --device cuda --dtype bfloat16 \
        --prompt "ROMEO:" --max-new-tokens 512
    step "sample.py bf16 --compile 124M" 90 "$PY" sample.py --ckpt /tmp/fsdp-gpu --device cuda --dtype bfloat16 \
        --prompt "ROMEO:" --max-new-tokens 512 --compile

    # 4. training throughput at GPT-2 small, bf16 + flash SDPA + compile vs nanoGPT in fp32 eager and as it runs on a GPU
    step "train_throughput 124M" 270 "$PY" benchmarks/train_throughput.py --device cuda \
        --vocab 50304 --block 1024 --batch 16 --layers 12 --heads 12 --width 768 \
        --variants nanogpt,nanogpt-bf16-compile,gpt2-sdpa-fp32,gpt2-sdpa-bf16,gpt2-sdpa-bf16-compile,modern-sdpa-bf16-compile,gpt2-auto \
        --sdpa-backend flash --warmup 3 --steps 10 --repeats 3 --save

    # 5. a short small.yaml run on the GPU, then its val loss vs wall-clock
    rm -rf /tmp/small-gpu
    step "small.yaml on cuda" 150 "$PY" train.py configs/small.yaml device=cuda dtype=bfloat16 train.max_iters=300 \
        eval.interval=100 wandb.mode=disabled out_dir=/tmp/small-gpu
    step "quality_vs_time table" 30 "$PY" benchmarks/quality_vs_time.py --metrics /tmp/small-gpu/metrics.jsonl \
        --note "trained by: python train.py configs/small.yaml device=cuda dtype=bfloat16 train.max_iters=300 eval.interval=100 wandb.mode=disabled out_dir=/tmp/small-gpu"

    # 6. sampling speed with and without the KV cache, on the GPU
    step "sample_speed cuda bf16" 90 "$PY" benchmarks/sample_speed.py --device cuda --dtype bfloat16 --reps 2

    # 6b. sampling against Hugging Face generate with identical weights (eager and compiled decode, CUDA graphs)
    step "sample_vs_hf cuda" 180 "$PY" benchmarks/sample_vs_hf.py --device cuda --dtype bfloat16 --shapes gpt2-124m \
        --new-tokens 128,512 --rounds 2 --through-sample-py

    # 7. where the time of a compiled bf16 124M step goes
    step "profile 124M bf16 compile" 120 "$PY" benchmarks/train_throughput.py --device cuda \
        --vocab 50304 --block 1024 --batch 16 --layers 12 --heads 12 --width 768 \
        --sdpa-backend flash --warmup 3 --profile gpt2-sdpa-bf16-compile --profile-steps 5

    # 8. results back
    if [[ "$OUT_DIR" != "." ]]; then
        cp benchmarks/RESULTS.md "$OUT_DIR/RESULTS.md" || FAILED+=("copy RESULTS.md")
        [[ -f /tmp/small-gpu/metrics.jsonl ]] && cp /tmp/small-gpu/metrics.jsonl "$OUT_DIR/small-gpu-metrics.jsonl"
        [[ -f /tmp/fsdp-gpu/metrics.jsonl ]] && cp /tmp/fsdp-gpu/metrics.jsonl "$OUT_DIR/fsdp-gpu-metrics.jsonl"
    fi
    set +x
    echo "=== done in ${SECONDS}s; ${#FAILED[@]} step(s) failed${FAILED[*]:+: }$(IFS=';'; echo "${FAILED[*]}") ==="
    return "${#FAILED[@]}"
}

main 2>&1 | tee "$LOG"
exit "${PIPESTATUS[0]}"
