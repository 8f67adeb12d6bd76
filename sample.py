"""Generate text from a trained checkpoint, and dump its attention maps over the prompt.

    python sample.py --prompt "ROMEO:"                       # the checkpoint of configs/small.yaml
    python sample.py --ckpt runs/x --prompt-file p.txt --num-samples 3 --temperature 0.8 --top-p 0.9
    python sample.py --prompt "To be, or not" --dump-attn all   # attn.npz (+ head roles, ablation, circuit), heatmaps,
                                                                # attention.html
    python sample.py --ckpt gpt2 --prompt "The animal didn't cross the street because it was tired" --dump-attn all
    python sample.py --ckpt gpt2 --quantize int8 --prompt "Hello"                    # int8 weights (CPU decoding)

--ckpt also takes a Hugging Face model folder or hub id (GPT-2, Llama family): converted in memory.

Loading reads only safetensors and JSON: nothing from the checkpoint is unpickled or executed, and nothing
in the run's folder is written, renamed or deleted (a training run may be saving into it meanwhile: the
checkpoint is read again if a save swapped it away mid-read). Attention dumps go to --dump-dir, by default
./attn_dump, never into a run or a model folder (common/paths.py says what marks one): refused in one line
before the model is built, as is a --num-samples whose generation cannot fit in memory (pretrained/memory.py:
generation_bytes). --quantize (int8 weights for CPU decoding, model/quantize.py) is applied to the built model, never
saved. On Linux with glibc it first runs itself again, once, with malloc's memory in 2 MB pages
(common/huge_pages.py; ATTNGPT_HUGE_PAGES=0 runs it as started). `~` in a path flag is the home folder. What
odd prompts do: docs/sampling.md (and a prompt may start with a dash: `--prompt "- item"`).
"""
from __future__ import annotations

import argparse
import codecs
import math
import sys
import time
from pathlib import Path

from common import console
from common.errors import ArgumentParser, UserError, out_of_memory, user_errors_exit
from common.huge_pages import restart_in_huge_pages
from common.paths import path_argument, path_text_argument
from data.tokenizer import REPLACEMENT_CHAR

DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "small.yaml"
PROMPT_FILE_LIMIT = 1_000_000  # bytes: far more than any block_size of text, far less than memory
DECODE_KERNEL_TEXT = ", attention on attngpt's decode kernel"  # the speed line's words for model/decode_attention.py
QUANTIZE_MODES = ("int8", "int8-dynamic")  # model.quantize.QUANTIZE_MODES, named here before torch's import


def default_checkpoint() -> Path:
    """small.yaml's out_dir: `python sample.py` works right after `python train.py configs/small.yaml`."""
    import yaml
    try:
        return Path(yaml.safe_load(DEFAULT_CONFIG.read_text())["out_dir"])
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        return Path("runs/small")


def positive_or_none(value: float | None, name: str, low: float) -> None:
    if value is None:
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"{name} must be a finite number, got {value}")
    if value < low:
        raise UserError(f"{name} must be >= {low}, got {value}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = ArgumentParser(prog="sample.py", description="Sample from a trained attngpt checkpoint.")
    p.add_argument("--ckpt", default=None, type=path_text_argument("--ckpt"),
                   help="a run's out_dir, a checkpoint folder, a Hugging Face model folder or hub id, e.g. gpt2 "
                        "(default: configs/small.yaml's out_dir)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", default="", help="text to continue (default: empty, see module doc)")
    src.add_argument("--prompt-file", type=path_argument("--prompt-file"), help="read the prompt from this UTF-8 file (at most 1 MB)")
    p.add_argument("--num-samples", type=int, default=1, help="samples drawn in one batch")
    p.add_argument("--max-new-tokens", type=int, default=500)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens")
    p.add_argument("--top-p", type=float, default=None, help="nucleus: the smallest set with this much mass")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N, mps or auto")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--no-kv-cache", action="store_true", help="recompute the whole window at every step")
    p.add_argument("--compile", action="store_true", help="compile the decode step (torch.compile; CUDA graphs on a "
                                                          "GPU): faster per token after a one-time compile")
    p.add_argument("--quantize", choices=QUANTIZE_MODES, default=None,
                   help="int8 weights, per output channel, for CPU decoding: int8 (weight-only; --dtype float32 or "
                        "bfloat16) or int8-dynamic (activations in int8 too, per token); model/quantize.py")
    p.add_argument("--dump-attn", metavar="SPEC", help="attention maps over the prompt: all | 0,2 | 1:3,0:1")
    p.add_argument("--no-circuit", action="store_true",
                   help="with --dump-attn: leave out the circuit (composition, path ablation, direct logits, OV "
                        "tokens), which takes minutes for a GPT-2-sized model on a CPU")
    p.add_argument("--dump-dir", type=path_argument("--dump-dir"),
                   help="where --dump-attn writes (default: ./attn_dump; for a Hugging Face model ./attn_dump/<name>; "
                        "never inside a run or model folder)")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(attach_dash_prompt(argv, p))
    if args.prompt == []:  # argparse before Python 3.12 drops a value of exactly "--" (its end-of-options marker)
        args.prompt = "--"
    return args


def attach_dash_prompt(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """argparse reads `--prompt -x` as an option missing its value, but a prompt may well start with a
    dash ("- a list item", "--- ACT II"). Join such a value to --prompt (`--prompt=-x`) unless it is one
    of the parser's own options (or a prefix of one, which argparse also accepts): then the prompt really
    is missing and argparse says so."""
    options = [s for action in parser._actions for s in action.option_strings]
    out: list[str] = []
    for i, arg in enumerate(argv):
        if arg == "--":  # everything after is positional: leave it as written
            return out + argv[i:]
        name = arg.split("=", 1)[0]
        option = len(name) > 1 and any(o.startswith(name) for o in options)
        if out and out[-1] == "--prompt" and arg.startswith("-") and not option:
            out[-1] = f"--prompt={arg}"
        else:
            out.append(arg)
    return out


def main(argv: list[str] | None = None) -> int:
    console.install("sample.py")
    args = parse_args(argv)
    with user_errors_exit("sample.py"):
        check_flags(args)  # before torch's seconds of import
    from pretrained.checkpoint import CheckpointError
    with user_errors_exit("sample.py", also=(CheckpointError,)):
        return run(args)


def check_flags(args: argparse.Namespace) -> None:
    """The flags that need no checkpoint: ranges of the sampling settings, and flags that exclude each other."""
    positive_or_none(args.temperature, "--temperature", 0.0)
    positive_or_none(args.top_k, "--top-k", 1)
    if args.top_p is not None and not 0.0 < args.top_p <= 1.0:
        raise UserError(f"--top-p must be in (0, 1], got {args.top_p}")
    positive_or_none(args.max_new_tokens, "--max-new-tokens", 0)
    positive_or_none(args.num_samples, "--num-samples", 1)
    if args.num_samples > 2**31 - 1:
        raise UserError(f"--num-samples must be at most 2**31-1 (and fit in memory), got {args.num_samples}")
    if args.compile and args.no_kv_cache:
        raise UserError("--compile compiles the KV-cache decode step: drop --no-kv-cache, or --compile")
    if args.no_circuit and args.dump_attn is None:
        raise UserError("--no-circuit changes what --dump-attn writes: add --dump-attn SPEC, or drop --no-circuit")
    if not -2**63 <= args.seed < 2**64:  # what torch.Generator.manual_seed takes
        raise UserError(f"--seed must be an integer from -2**63 to 2**64-1, got {args.seed}")
    if args.quantize is not None:
        if args.device != "auto":
            check_quantize_device(args.quantize, args.device)
        if args.quantize == "int8" and args.dtype == "float16":
            # torch's int8 kernels take float32 or bfloat16 rows: float16 would dequantize the weights at every matmul
            raise UserError("--quantize int8 runs its int8 kernels on float32 or bfloat16 activations, not --dtype "
                            "float16: use --dtype float32 (the default) or bfloat16")


def check_quantize_device(mode: str, device: str) -> None:
    """--quantize with anything but a CPU is refused (a device string, or a resolved torch.device)."""
    if str(device).split(":")[0] != "cpu":
        raise UserError(f"--quantize {mode} runs on a CPU only (torch's int8 kernels used here are CPU kernels), "
                        f"not --device {device}: drop --quantize, or use --device cpu")


def run(args: argparse.Namespace) -> int:
    """Load the checkpoint, generate and print the samples, dump attention maps: flags already checked."""
    import torch
    from common.device import resolve_device
    from common.paths import check_outside_runs
    from insight.dump import dump_internals, parse_layer_heads, prompt_circuit_scores, prompt_head_scores
    from insight.explorer import ExplorerOptions, HeadScores
    from pretrained.memory import device_memory, generation_bytes, human_bytes, param_count
    from model.generate import compile_repays, generate
    from model.packed import PACKED_WEIGHTS_TEXT, pack_linears, packing_of
    from pretrained.load import open_pretrained

    device = resolve_device(args.device, setting="--device ")
    if args.quantize is not None:
        check_quantize_device(args.quantize, device)  # --device auto resolved: still before the model is built
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]
    if dtype == torch.float16 and device.type == "cpu":
        raise UserError("--dtype float16 is slow or unsupported on CPU: use bfloat16 or float32")
    prompt = read_prompt_file(args.prompt_file) if args.prompt_file is not None else args.prompt
    source = open_pretrained(args.ckpt or str(default_checkpoint()), hub=args.ckpt is not None)
    tokenizer, cfg = source.tokenizer, source.config
    ids = tokenizer.prompt_ids(prompt)
    if len(ids) > cfg.block_size:
        print(f"warning: the prompt has {len(ids)} tokens; the model sees at most block_size={cfg.block_size}, "
              f"so only its last {cfg.block_size} are used", file=sys.stderr)
        ids = ids[-cfg.block_size:]
    dump_dir = (args.dump_dir or source.default_dump_dir()) if args.dump_attn is not None else None
    if dump_dir is not None:  # a dump never goes into a run or model folder (a reader never writes there)
        check_outside_runs(dump_dir, "--dump-dir", "pass --dump-dir a folder outside it (the default is ./attn_dump)")
    model = source.build(device=device, dtype=dtype)  # refuses a model that cannot fit before building it
    cfg = model.config
    quantized = None
    if args.quantize is not None:
        from native.build import int8_matvec_library
        from model.quantize import quantize_int8
        # in place; the LM head, and for int8 the kernel of single rows (built here at first use), by measurement
        quantized = quantize_int8(model, args.quantize,
                                  int8_kernel=int8_matvec_library() if args.quantize == "int8" else None)
        print(f"quantized: {quantized}", file=sys.stderr)
    # what generating allocates, checked before any of it is: N samples at once can need far more than the model
    weight_bytes = param_count(cfg) * dtype.itemsize
    needed = weight_bytes + generation_bytes(
        cfg, args.num_samples, len(ids), args.max_new_tokens, dtype.itemsize, kv_cache=not args.no_kv_cache)
    if needed > (available := device_memory(device)):
        what = ("the model and its KV cache" if not args.no_kv_cache
                else "the model and the activations of the whole window at every step (--no-kv-cache)")
        raise UserError(f"not enough memory on {device} for {args.num_samples} sample(s) at once: {what} would "
                        f"need at least {human_bytes(needed)}, the device has {human_bytes(available)}: "
                        f"lower --num-samples or --max-new-tokens")
    if device.type == "cpu" and needed + weight_bytes <= available:
        # the matmul weights prepared for the kernel that times fastest at one row (model/packed.py), and for a
        # matvec kernel a oneDNN-packed copy for the prompt's prefill too where memory holds one more copy
        pack_linears(model, rows_copy=needed + 2 * weight_bytes <= available)
    if device.type == "cpu" and not args.no_kv_cache:
        from native.build import decode_attention_library
        from model.decode_attention import use_decode_attention
        # each decoded token's attention over the cache on our kernel where it times faster (built here at first use)
        use_decode_attention(model, decode_attention_library(), args.num_samples,
                             min(cfg.block_size, len(ids) + args.max_new_tokens))
    idx = torch.tensor([ids], dtype=torch.long, device=device)

    if args.dump_attn is not None:  # an empty spec is an error, not "no dump"
        try:
            heads = parse_layer_heads(args.dump_attn, cfg.n_layer, cfg.n_head)
        except ValueError as e:
            raise UserError(f"--dump-attn: {e}") from None
        internals = model.attention_internals(idx, layers=sorted(heads))  # weights, q, k, v, W_O
        scores, scores_note = prompt_head_scores(model, idx, tokenizer)  # every layer's roles and ablation
        # composition, path ablation, direct logits: the dump's slowest part on a large model
        circuit = None if args.no_circuit else prompt_circuit_scores(model, idx, tokenizer)
        try:
            written = dump_internals(internals, heads, tokenizer.token_strings(ids), dump_dir, token_ids=ids,
                                     options=ExplorerOptions(title=f"attention of {source.label}", n_layer=cfg.n_layer,
                                                             quantized=quantized or ""),
                                     scores=HeadScores(scores, scores_note, circuit))
        except OSError as e:  # a --dump-dir that is a file, or not writable
            raise UserError(f"cannot write attention maps into '{dump_dir}': {e.strerror or e}; "
                            f"pass a writable folder with --dump-dir") from None
        print(f"attention maps of layers {', '.join(map(str, sorted(heads)))} over {len(ids)} prompt tokens: "
              f"{', '.join(str(p) for p in written)}", file=sys.stderr)
        notes = scores_note if circuit is None else f"{scores_note}; {circuit.note}"
        for part in notes.split("; "):  # a 1-token prompt, a block too short for the probe
            if "NaN" in part:
                print(f"note: {part}", file=sys.stderr)

    compile_step = args.compile
    if compile_step:  # on a CPU only where the compile can pay for itself in this generation
        compile_step, why = compile_repays(model, args.num_samples, args.max_new_tokens)
        if not compile_step:
            print(f"note: --compile: not compiled, decoding eagerly: {why}", file=sys.stderr)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    batch = idx.expand(args.num_samples, -1)
    stream = StreamPrinter(tokenizer, prompt_ids=ids) if args.num_samples == 1 else None
    t0 = time.perf_counter()
    try:
        out = generate(model, batch, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                       top_p=args.top_p, generator=generator, use_kv_cache=not args.no_kv_cache, compile=compile_step,
                       stop_token=tokenizer.eot, on_token=stream.push if stream else None)
    except RuntimeError as e:  # CPU: "can't allocate memory"; CUDA: torch.cuda.OutOfMemoryError
        if out_of_memory(e, device, "") is None:
            raise
        raise UserError(f"not enough memory on {device} for {args.num_samples} sample(s) at once: lower "
                        f"--num-samples") from None
    elapsed = time.perf_counter() - t0
    new_tokens = out.shape[1] - len(ids)
    if stream:
        stream.finish()
    else:
        for i, row in enumerate(out.tolist()):
            generated = row[len(ids):]
            if tokenizer.eot is not None and tokenizer.eot in generated:
                generated = generated[:generated.index(tokenizer.eot)]
            print(f"--- sample {i + 1}\n{tokenizer.decode(ids + generated)}")
    print(f"[{new_tokens} tokens x {args.num_samples} in {elapsed:.2f}s: "
          f"{new_tokens * args.num_samples / max(elapsed, 1e-9):.1f} tokens/s, "
          f"{'no KV cache' if args.no_kv_cache else 'KV cache'}{', compiled decode' if compile_step else ''}"
          f"{DECODE_KERNEL_TEXT if model.blocks[0].attn.decode_kernel is not None and not compile_step else ''}"
          f"{f', --quantize {args.quantize}' if args.quantize else ''}{PACKED_WEIGHTS_TEXT.get(packing_of(model), '')}, "
          f"{source.label}]", file=sys.stderr)
    return 0


def read_prompt_file(path: Path) -> str:
    """The UTF-8 text of `path`, read up to PROMPT_FILE_LIMIT bytes: a larger file (or /dev/zero, a pipe
    that never ends) is refused instead of filling memory."""
    try:
        with open(path, "rb") as f:
            data = f.read(PROMPT_FILE_LIMIT + 1)
    except OSError as e:
        raise UserError(f"cannot read --prompt-file '{path}': {e.strerror or e}") from None
    if len(data) > PROMPT_FILE_LIMIT:
        raise UserError(f"--prompt-file '{path}' holds more than {PROMPT_FILE_LIMIT:,} bytes (the limit; the model "
                        f"sees only its last block_size tokens anyway): pass a shorter file")
    try:  # universal newlines, as a text-mode read gives
        return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    except UnicodeDecodeError as e:
        raise UserError(f"cannot read --prompt-file '{path}': {e}") from None


class StreamPrinter:
    """Prints a single sample as it is generated, the text decode gives for all its tokens, written as it settles.

    A byte-level tokenizer's (one with token_bytes: tiktoken's) text is its tokens' bytes read as UTF-8: each new
    token's bytes go through an incremental UTF-8 decoder, which holds back a character split across tokens (a
    BPE token can end mid-character), in the same time at every length. Any other tokenizer's text is decoded from
    all tokens so far and only the new suffix printed, holding back a trailing U+FFFD (maybe half a character)."""

    def __init__(self, tokenizer, prompt_ids: list[int]):
        self.tokenizer = tokenizer
        self.token_bytes = getattr(tokenizer, "token_bytes", None)
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")  # as decode's errors="replace"
        self.ids = list(prompt_ids)
        self.printed = 0  # characters of the decoded text written so far (no token_bytes)
        self.stopped = False
        if self.token_bytes is None:
            self._print()
        else:
            self._write("".join(self._bytes_text(i) for i in self.ids))

    def push(self, token) -> None:
        if self.stopped:
            return
        token = token.item()  # the one sample's (1,) column; ~8 us less than int(token[0])'s indexing
        if token == self.tokenizer.eot:
            self.stopped = True
            return
        if self.token_bytes is not None:
            self._write(self._bytes_text(token))
            return
        self.ids.append(token)
        self._print(hold=True)

    def finish(self) -> None:
        if self.token_bytes is not None:
            self._write(self.utf8.decode(b"", final=True) + "\n")  # a character left unfinished reads U+FFFD
        else:
            self._print(end="\n")

    def _bytes_text(self, token: int) -> str:
        """The text token completes: its bytes through the decoder; an id outside the vocabulary ends what was
        pending (as decode ends a run there) and reads U+FFFD."""
        piece = self.token_bytes(token)
        if piece is None:
            return self.utf8.decode(b"", final=True) + REPLACEMENT_CHAR
        return self.utf8.decode(piece)

    def _write(self, text: str) -> None:
        if text:
            sys.stdout.write(text)
            sys.stdout.flush()

    def _print(self, hold: bool = False, end: str = "") -> None:
        text = self.tokenizer.decode(self.ids)
        if hold and text.endswith(REPLACEMENT_CHAR):
            return  # maybe half a character: wait for the next token
        self._write(text[self.printed:] + end)
        self.printed = len(text)


if __name__ == "__main__":
    restart_in_huge_pages("sample.py")  # the weights in 2 MB pages: decoding streams them all (common/huge_pages.py)
    sys.exit(main())
