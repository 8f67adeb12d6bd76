#!/usr/bin/env bash
# hf_gpu_check.sh: the Hugging Face paths on a CUDA machine in one run (~6 min on one H200).
#
#   bash benchmarks/hf_gpu_check.sh      # from the repository root, with data/cache/ prepared and carried:
#   run(command="bash benchmarks/hf_gpu_check.sh", carry=["data/cache"], timeout_s=580)
#
# The machine has no network: data/cache/ must hold the GPT-2 BPE tinyshakespeare bins
# (python -m data.prepare configs/finetune-gpt2.yaml) and a copy of the tiktoken cache in data/cache/tiktoken_cache.
# No real GPT-2 can be downloaded there either, so the fine-tuning recipe starts from a random GPT-2 124M saved
# with transformers' save_pretrained: it checks the path (HF folder -> init_from -> bf16 + compile on CUDA ->
# checkpoint -> sample -> export -> transformers), not the quality.
#   1. benchmarks/hf_parity.py: logits, greedy tokens and sampling speed vs transformers, GPT-2 124M and a 1B Llama
#   2. tests/pretrained/test_convert.py and tests/pretrained/hf/ against the machine's own transformers version
#   3. configs/finetune-gpt2.yaml from that random GPT-2 folder, 40 steps; sample; --dump-attn; to-hf; logits
set -u -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
OUT_DIR="${OUT:-.}"
PY="${PYTHON:-python3}"
export TIKTOKEN_CACHE_DIR="$PWD/data/cache/tiktoken_cache" WANDB_MODE=disabled HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
    PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
SENTENCE="The animal didn't cross the street because it was tired"
FAILED=0
step() {  # step LIMIT_S CMD...: run CMD with a time limit, count a failure
    local limit=$1
    shift
    echo "=== $* (limit ${limit}s, ${SECONDS}s elapsed)"
    timeout "$limit" "$@" || { echo "FAILED: $*"; FAILED=$((FAILED + 1)); }
}

{
nvidia-smi -L
step 240 "$PY" benchmarks/hf_parity.py --device cuda --models gpt2-124m,llama-1b --new-tokens 100
step 150 "$PY" -m pytest -q -p no:cacheprovider tests/pretrained/test_convert.py tests/pretrained/hf
step 120 "$PY" -c "
import transformers
from pathlib import Path
from tests.hf_models import gpt2_tokenizer_dir
transformers.GPT2LMHeadModel(transformers.GPT2Config()).save_pretrained('/tmp/hf/gpt2')
transformers.AutoTokenizer.from_pretrained(gpt2_tokenizer_dir(Path('/tmp/hf/tok'))).save_pretrained('/tmp/hf/gpt2')"
step 240 "$PY" train.py configs/finetune-gpt2.yaml train.init_from=/tmp/hf/gpt2 train.max_iters=40 eval.interval=20 \
    eval.iters=5 out_dir=/tmp/ft
step 60 "$PY" sample.py --ckpt /tmp/ft --device cuda --dtype bfloat16 --prompt "ROMEO:" --max-new-tokens 40
step 60 "$PY" sample.py --ckpt /tmp/hf/gpt2 --device cuda --prompt "$SENTENCE" --max-new-tokens 0 --dump-attn 5 \
    --dump-dir "$OUT_DIR/attn_gpt2"
step 60 "$PY" convert.py to-hf /tmp/ft /tmp/ft_hf
step 60 "$PY" -c "
import torch, transformers
from pretrained.load import open_pretrained
ours = open_pretrained('/tmp/ft').build(device='cuda')
theirs = transformers.AutoModelForCausalLM.from_pretrained('/tmp/ft_hf').cuda().eval()
idx = torch.randint(0, 50257, (2, 1024), device='cuda')
with torch.no_grad():
    print('fine-tuned GPT-2 124M, exported: max |logit diff| vs transformers, fp32, 2x1024 tokens:',
          (ours(idx)[0] - theirs(idx).logits).abs().max().item())"
echo "done in ${SECONDS}s, $FAILED failed step(s)"
exit $FAILED
} 2>&1 | tee "$OUT_DIR/hf_gpu_check.log"
