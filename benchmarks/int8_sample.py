"""Int8 decoding (sample.py --quantize, model/quantize.py) against float32 and bfloat16: speed, greedy agreement
and val loss, on one CPU, batch 1.

Variants (each built fresh from the same weights; the LM head either float or int8, never measured here):
  float32, bfloat16                the float model
  int8/<dtype> [head int8]         weight-only int8: each token's activations as two int8 digits (single rows on
                                   native/int8_matvec.c where quantize_int8 timed it faster, else and for several
                                   rows FBGEMM), or bfloat16 rows into _weight_int8pack_mm where this torch has
                                   neither
  int8-dynamic/<dtype> [head int8] int8 weights and per-token int8 activations (FBGEMM / torch._int_mm)
                                   (the rest of the model -- attention, norms, embedding -- in <dtype>)
For each: ms/token = wall time of one model.generate.generate call (greedy, KV cache, prompt prefill included)
over its new tokens, median of --rounds interleaved rounds (each round runs every variant once, starting one
variant later each round); agreement = the share of the first --agree new tokens identical to float32's, and the
first position where they differ; val loss = the mean next-token loss on --val-batches batches of the val split
(the same batches for every variant), when the checkpoint is a train.py run whose prepared data is on this
machine (its config.yaml names it; nothing is prepared here).

    python benchmarks/int8_sample.py --ckpt runs/small [--new-tokens 128] [--prompt 32] [--rounds 3]
    python benchmarks/int8_sample.py --shape gpt2-124m [--threads 2] [--save]
    python benchmarks/int8_sample.py --shape gpt2-124m --kernels [--save]
    python benchmarks/int8_sample.py --ckpt runs/small --through-sample-py [--rounds 5] [--save]

--kernels times, instead, the matmul kernels alone at one row (1, d_model): every block matmul of the shape as a
separate weight of its own, called in turn as a decode step calls them (so that they stream from memory, not
from cache), and the LM head on its own; per kernel the median over --rounds interleaved rounds, and the
weights' bytes read per second.

--through-sample-py runs, instead, `python sample.py` as a user runs it (greedy, --new-tokens, its own tokens/s
line; one process a run) on the same weights saved as float32: --dtype bfloat16, and --quantize int8 on float32
and on bfloat16, and --quantize int8-dynamic, each once a round over --rounds interleaved rounds; per run the
median tokens/s, its ratio to bfloat16's, and the median of each round's own ratio to that round's bfloat16
run (paired: drift between minutes moves both alike). sample.py decides the LM head itself (model/quantize.py: timed).

--ckpt takes what sample.py's --ckpt takes (a run's out_dir, a checkpoint folder, a Hugging Face folder or hub
id); --shape a random model of sample_vs_hf.py's SHAPES, seeded: its greedy text is near-uniform guessing, so
its agreement says little (a checkpoint's does). --save appends the table to benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import copy
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch

import _limits
import _report
from common.errors import ArgumentParser, UserError, user_errors_exit
from common.huge_pages import restart_in_huge_pages
from model import GPT
from model.generate import generate
from model.packed import MATVEC, PackedLinear, onednn_packs, pack_linears, packing_of
from native.build import int8_matvec_library
from model.quantize import Int8Linear, digit_levels, quantize_int8


@dataclass(frozen=True)
class Variant:
    name: str
    dtype: torch.dtype
    mode: str | None = None  # None: the float model
    lm_head: bool = False


VARIANTS = (
    Variant("float32", torch.float32),
    Variant("bfloat16", torch.bfloat16),
    Variant("int8/float32", torch.float32, "int8"),
    Variant("int8/float32 head int8", torch.float32, "int8", True),
    Variant("int8/bfloat16", torch.bfloat16, "int8"),
    Variant("int8/bfloat16 head int8", torch.bfloat16, "int8", True),
    Variant("int8-dynamic/float32", torch.float32, "int8-dynamic"),
    Variant("int8-dynamic/float32 head int8", torch.float32, "int8-dynamic", True),
    Variant("int8-dynamic/bfloat16", torch.bfloat16, "int8-dynamic"),
    Variant("int8-dynamic/bfloat16 head int8", torch.bfloat16, "int8-dynamic", True),
)


def model_source(args: argparse.Namespace):
    """(build(dtype) -> a fresh eval-mode GPT on the CPU, label, the val data or None, a note on the val data)."""
    if args.ckpt is not None:
        from pretrained.load import open_pretrained
        source = open_pretrained(args.ckpt)
        prepared, note = find_val_data(Path(args.ckpt))
        return (lambda dtype: source.build(device="cpu", dtype=dtype).eval()), source.label, prepared, note
    from sample_vs_hf import SHAPES
    config = SHAPES[args.shape]

    def build(dtype: torch.dtype) -> GPT:
        torch.manual_seed(0)
        return GPT(config).to(dtype).eval()
    return build, f"random {args.shape}", None, "no val loss: a random model (--shape) has no data"


def find_val_data(ckpt: Path):
    """The prepared data of the train.py run `ckpt` belongs to (its out_dir, or best/ / latest/ in it), read as it
    is: (PreparedData, what it is) or (None, why there is none). Nothing is prepared or downloaded."""
    from data.prepare import fingerprint, prepared_root
    from data.prepared import load_prepared
    from data.sources import resolve_corpus
    from training.config import load_run_config

    run = next((f for f in (ckpt, ckpt.parent) if (f / "config.yaml").is_file()), None)
    if run is None:
        return None, f"no val loss: no train.py run config.yaml at {ckpt} or its parent"
    cfg = load_run_config(run / "config.yaml", [])
    try:
        if cfg.data.source == "tinyshakespeare" and not any(prepared_root().glob("tinyshakespeare*")):
            raise UserError("tinyshakespeare is not prepared on this machine")
        corpus = resolve_corpus(cfg.data, quiet=True)
        folder, fp = fingerprint(cfg.data, corpus)
        prepared = load_prepared(prepared_root() / folder)
    except (UserError, OSError) as e:
        return None, f"no val loss: the run's prepared data is not readable here ({e})"
    if prepared.meta.get("fingerprint") != fp:
        return None, f"no val loss: {prepared.dir} was prepared from other files than the run's config names"
    return prepared, f"val loss on the val split of {prepared.dir}"


@torch.no_grad()
def val_loss(model: GPT, prepared, batches: int, batch_size: int) -> float:
    """Mean next-token loss over the first `batches` val batches of a fixed seed: the same windows for every model."""
    from data.loader import BatchLoader
    loader = BatchLoader(prepared.split_files("val"), model.config.block_size, batch_size, seed=0)
    return statistics.fmean(float(model(*loader.next_batch())[1]) for _ in range(batches))


def agreement(tokens: torch.Tensor, reference: torch.Tensor, n: int) -> tuple[float, str]:
    """(share of the first n new tokens equal to the reference's, first differing position or '-')."""
    same = (tokens[0, :n] == reference[0, :n]).tolist()
    return sum(same) / len(same), str(same.index(False)) if False in same else "-"


def main() -> None:
    parser = ArgumentParser(prog="int8_sample", description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--ckpt", help="what sample.py --ckpt takes: a run's out_dir, checkpoint, HF folder or hub id")
    source.add_argument("--shape", help="a random model of one of sample_vs_hf.py's SHAPES (default small)")
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens (random ids, seeded)")
    parser.add_argument("--new-tokens", type=int, default=128, help="new tokens per generation")
    parser.add_argument("--agree", type=int, default=None, help="tokens compared with float32 (default: all new)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (median reported)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    parser.add_argument("--val-batches", type=int, default=4, help="val batches for the loss (0: none)")
    parser.add_argument("--val-batch-size", type=int, default=4)
    instead = parser.add_mutually_exclusive_group()
    instead.add_argument("--kernels", action="store_true", help="time the matmul kernels alone at one row instead")
    instead.add_argument("--through-sample-py", action="store_true",
                         help="time sample.py as a user runs it (bfloat16, --quantize int8, int8-dynamic) instead")
    parser.add_argument("--save", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = parser.parse_args()
    with user_errors_exit("int8_sample"):
        if args.ckpt is None and args.shape is None:
            args.shape = "small"
        from sample_vs_hf import SHAPES
        if args.shape is not None and args.shape not in SHAPES:
            raise UserError(f"--shape {args.shape!r}: use one of {', '.join(SHAPES)}")
        if min(args.prompt, args.new_tokens, args.rounds, args.threads, args.val_batch_size) < 1 or args.val_batches < 0:
            raise UserError("--prompt, --new-tokens, --rounds, --threads and --val-batch-size must be >= 1, "
                            "--val-batches >= 0")
        agree = args.new_tokens if args.agree is None else args.agree
        if not 1 <= agree <= args.new_tokens:
            raise UserError(f"--agree must be in 1..--new-tokens ({args.new_tokens}), got {agree}")
        torch.set_num_threads(args.threads)
        build, label, prepared, val_note = model_source(args)
        if args.kernels:
            return kernel_report(build, label, args)
        if args.through_sample_py:
            return sample_py_report(build, label, args)
        rows = run_variants(build, prepared, args, agree)
        machine_line = int8_machine_line()
        notes = [f"{label}; prompt {args.prompt} random tokens, {args.new_tokens} new, greedy, batch 1, KV cache; "
                 f"ms/token = one generate call (prefill included) / new tokens, median of {args.rounds} interleaved "
                 f"rounds; agreement over the first {agree} new tokens against float32's",
                 val_note + (f" ({args.val_batches} batches of {args.val_batch_size}, the same for every variant)"
                             if prepared is not None and args.val_batches else "")]
        table = ["| variant | ms/token | vs float32 | vs bfloat16 | greedy agreement | first difference | val loss |",
                 "|---|---:|---:|---:|---:|---:|---:|"]
        base, bf16 = rows[0]["ms"], rows[1]["ms"]
        for row in rows:
            loss = f"{row['loss']:.4f}" if row["loss"] is not None else "-"
            table.append(f"| {row['name']} | {row['ms']:.2f} | {base / row['ms']:.2f}x | {bf16 / row['ms']:.2f}x | "
                         f"{row['agree']:.3f} | {row['first']} | {loss} |")
        for row in rows:
            if row["description"]:
                notes.append(f"{row['name']}: {row['description']}")
        print("\n".join([machine_line, "", *notes, "", *table]))
        if args.save:
            _report.save(argparse.Namespace(no_save=False), "Int8 decoding (sample.py --quantize)", machine_line,
                         "int8_sample.py", *[f"- {n}" for n in notes], "", *table, "")


def int8_machine_line() -> str:
    """The machine line with the CPU flags that decide bfloat16 and int8 speed."""
    return _report.machine(torch_threads=True, extra=[
        _report.cpu_bf16_support() + ", " + _report.flag_list(("avx512_vnni", "amx_int8"))])


class WeightPackKernel(torch.nn.Module):
    """Int8Linear's weight-only bfloat16 path alone (_weight_int8pack_mm: what compiled code and a torch without
    FBGEMM run), beside the two-digit FBGEMM path its forward takes here."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.layer = Int8Linear.from_linear(linear, "int8")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer.run(x, one_row_kernels=False)


def native_layer(linear: torch.nn.Linear) -> Int8Linear:
    """Weight-only int8 with single rows on native/int8_matvec.c (what quantize_int8 keeps where it times faster)."""
    layer = Int8Linear.from_linear(linear, "int8")
    layer.use_native_kernel(int8_matvec_library())
    return layer


def kernel_report(build, label: str, args: argparse.Namespace) -> None:
    """The --kernels table: each kernel over all the block matmuls in turn, and over the LM head, at one row."""
    model = build(torch.float32)
    blocks = [getattr(parent, attr) for _, parent, attr in model.matmul_slots()[:-1]]  # nn.Linear each
    head = model.lm_head
    kernels = {  # name -> (activation dtype, make one layer's module from an nn.Linear)
        "bfloat16 F.linear": (torch.bfloat16, lambda lin: copy.deepcopy(lin).to(torch.bfloat16)),
        "bfloat16 oneDNN-packed": (torch.bfloat16, lambda lin: PackedLinear(copy.deepcopy(lin).to(torch.bfloat16))),
        "bfloat16 matvec (ATen's kernel)": (torch.bfloat16,
                                            lambda lin: PackedLinear(copy.deepcopy(lin).to(torch.bfloat16), MATVEC)),
        "int8 (_weight_int8pack_mm)": (torch.bfloat16, WeightPackKernel),
        "int8 (two int8 digits, FBGEMM)": (torch.float32, lambda lin: Int8Linear.from_linear(lin, "int8")),
        "int8 (two int8 digits, native/int8_matvec.c)": (torch.float32, native_layer),
        "int8-dynamic (one-row kernel)": (torch.float32, lambda lin: Int8Linear.from_linear(lin, "int8-dynamic")),
    }
    if not onednn_packs(torch.bfloat16):
        del kernels["bfloat16 oneDNN-packed"]
    if digit_levels() is None:
        del kernels["int8 (two int8 digits, FBGEMM)"]
    if int8_matvec_library() is None:
        del kernels["int8 (two int8 digits, native/int8_matvec.c)"]
    table = ["| kernel | block matmuls ms | GB/s | LM head ms | GB/s |", "|---|---:|---:|---:|---:|"]
    for name, (dtype, make) in kernels.items():
        with torch.no_grad():
            layers = [make(lin).eval() for lin in blocks]
            head_layer = make(head).eval()
            rows = [torch.randn(1, lin.in_features, generator=torch.Generator().manual_seed(i)).to(dtype)
                    for i, lin in enumerate(blocks)]
            head_row = torch.randn(1, head.in_features, generator=torch.Generator().manual_seed(len(rows))).to(dtype)
            seconds = _report.interleaved({"blocks": lambda: [layer(x) for layer, x in zip(layers, rows)],
                                           "head": lambda: head_layer(head_row)}, rounds=args.rounds, calls=3,
                                          warmup=2)
        block_bytes = sum(_limits.stored_bytes(layer) for layer in layers)
        # three significant digits, not fixed decimals: a small shape's head takes ~0.01 ms and moves ~0.1 GB/s,
        # which two decimals would print as a zero on a faster machine
        table.append(f"| {name} | {seconds['blocks'] * 1e3:.3g} | {block_bytes / seconds['blocks'] / 1e9:.3g} | "
                     f"{seconds['head'] * 1e3:.3g} | {_limits.stored_bytes(head_layer) / seconds['head'] / 1e9:.3g} |")
    machine_line = int8_machine_line()
    notes = [f"{label}: {len(blocks)} block matmuls, each its own weight, called in turn at one row (1, in), and "
             f"the {head.out_features} x {head.in_features} LM head; median of {args.rounds} interleaved rounds of 3 "
             f"calls; GB/s = the layers' stored bytes (_limits.stored_bytes: int8 weights and their scales, or the float "
             f"weight) / time"]
    print("\n".join([machine_line, "", *notes, "", *table]))
    if args.save:
        _report.save(argparse.Namespace(no_save=False), "Int8 matmul kernels at one row", machine_line,
                     "int8_sample.py", *[f"- {n}" for n in notes], "", *table, "")


SAMPLE_PY_RUNS = {"bfloat16": ["--dtype", "bfloat16"],  # name -> sample.py's flags (--through-sample-py)
                  "int8/float32": ["--dtype", "float32", "--quantize", "int8"],
                  "int8/bfloat16": ["--dtype", "bfloat16", "--quantize", "int8"],
                  "int8-dynamic/float32": ["--dtype", "float32", "--quantize", "int8-dynamic"]}


def sample_py_report(build, label: str, args: argparse.Namespace) -> None:
    """--through-sample-py: sample.py's own tokens/s for each of SAMPLE_PY_RUNS (module doc)."""
    from sample_vs_hf import sample_py_rates
    model = build(torch.float32)
    prompt = torch.randint(0, model.config.vocab_size, (1, args.prompt), generator=torch.Generator().manual_seed(1))

    def progress(so_far: dict[str, list[float]]) -> None:
        print("  round: " + ", ".join(f"{name} {values[-1]:.1f}" for name, values in so_far.items()) + " tok/s",
              flush=True)
    rates = sample_py_rates(model, prompt, args.new_tokens, SAMPLE_PY_RUNS, args.rounds, after_each=progress)
    median = {name: statistics.median(values) for name, values in rates.items()}
    machine_line = int8_machine_line()
    note = (f"{label}, saved as float32; `python sample.py --temperature 0 --max-new-tokens {args.new_tokens}` on a "
            f"{args.prompt}-token prompt, its own tokens/s line, one process a run, median of {args.rounds} "
            f"interleaved rounds")
    # each round's rate over bfloat16's in the same round, median of those: drift between minutes moves both sides
    # of a round's pair alike, where the two medians may come from different minutes
    paired = {name: statistics.median(v / b for v, b in zip(values, rates["bfloat16"], strict=True))
              for name, values in rates.items()}
    table = ["| sample.py flags | tokens/s | vs bfloat16 | vs bfloat16, paired by round | each round |",
             "|---|---:|---:|---:|---|",
             *(f"| `{' '.join(SAMPLE_PY_RUNS[name])}` | {median[name]:.1f} | "
               f"{median[name] / median['bfloat16']:.2f}x | {paired[name]:.2f}x | "
               f"{', '.join(f'{v:.1f}' for v in rates[name])} |"
               for name in SAMPLE_PY_RUNS)]
    print("\n".join([machine_line, "", note, "", *table]))
    if args.save:
        _report.save(argparse.Namespace(no_save=False), "Int8 decoding through sample.py", machine_line,
                     "int8_sample.py", f"- {note}", "", *table, "")


def run_variants(build, prepared, args: argparse.Namespace, agree: int) -> list[dict]:
    """One row per VARIANTS entry: name, ms (per token), agree, first, loss (None without val data), description."""
    models, descriptions = {}, {}
    for variant in VARIANTS:
        model = build(variant.dtype)
        quantized = (quantize_int8(model, variant.mode, lm_head=variant.lm_head, int8_kernel=int8_matvec_library())
                     if variant.mode else "")
        pack_linears(model, rows_copy=True)  # as sample.py does: what is left in float, prepacked where faster
        packing = packing_of(model)
        descriptions[variant.name] = "; ".join(filter(None, [quantized, f"float matmuls {packing}" if packing else ""]))
        models[variant.name] = model
    vocab = models["float32"].config.vocab_size
    prompt = torch.randint(0, vocab, (1, args.prompt), generator=torch.Generator().manual_seed(1))
    runs = {name: (lambda m=model: generate(m, prompt, args.new_tokens, temperature=0.0))
            for name, model in models.items()}
    tokens = {name: run()[:, args.prompt:] for name, run in runs.items()}  # warm-up, and the greedy tokens
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            seconds[name].append(_report.timed(runs[name])[0])
        print(f"  round {r + 1}: " + ", ".join(f"{n} {1e3 * seconds[n][-1] / args.new_tokens:.1f}" for n in names)
              + " ms/token", flush=True)
    rows = []
    for name in names:
        share, first = agreement(tokens[name], tokens["float32"], agree)
        loss = (val_loss(models[name], prepared, args.val_batches, args.val_batch_size)
                if prepared is not None and args.val_batches else None)
        rows.append({"name": name, "ms": 1e3 * statistics.median(seconds[name]) / args.new_tokens, "agree": share,
                     "first": first, "loss": loss, "description": descriptions[name]})
    return rows


if __name__ == "__main__":
    restart_in_huge_pages("int8_sample")  # as sample.py runs: both sides and the floors on the same pages
    main()
