"""Convert models between attngpt and the Hugging Face layout.

    python convert.py to-hf CKPT OUT_DIR      # attngpt checkpoint (folder or run out_dir) -> HF folder
    python convert.py from-hf SRC OUT_DIR     # HF folder or hub id (gpt2, a Llama-family id) -> attngpt folder

to-hf writes what `transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR)` loads (GPT2LMHeadModel for
learned positions + LayerNorm + GELU, LlamaForCausalLM for RoPE + RMSNorm + SwiGLU), with tokenizer files.
OUT_DIR must be new or empty; --force replaces only a folder convert.py wrote before (it holds
.attngpt-convert.json). OUT_DIR is never the source, inside it or around it, nor inside a training run or a
checkpoint or model folder, --force or not. Nothing is left half-written. `~` in a path is the home folder.
"""
from __future__ import annotations

import shlex
import sys

from common import console
from common.errors import ArgumentParser, user_errors_exit
from common.paths import path_argument


def main(argv: list[str] | None = None) -> int:
    console.install("convert.py")
    parser = ArgumentParser(prog="convert.py", description="Convert models between attngpt and Hugging Face.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{to-hf,from-hf}")
    to_hf = commands.add_parser("to-hf", help="attngpt checkpoint -> Hugging Face folder")
    to_hf.add_argument("ckpt", metavar="CKPT", type=path_argument("CKPT"),
                       help="an attngpt checkpoint folder or a run's out_dir")
    from_hf = commands.add_parser("from-hf", help="Hugging Face folder or hub id -> attngpt checkpoint folder")
    from_hf.add_argument("src", metavar="SRC", help="a Hugging Face model folder or a hub id (e.g. gpt2)")
    for sub in (to_hf, from_hf):
        sub.error = parser.error  # one-line errors from the subcommands too
        sub.add_argument("out_dir", metavar="OUT_DIR", type=path_argument("OUT_DIR"),
                         help="the folder to write (new or empty; never inside a run or model folder)")
        sub.add_argument("--force", action="store_true", help="replace OUT_DIR if convert.py wrote it before")
    args = parser.parse_args(argv)

    from pretrained.checkpoint import CheckpointError
    with user_errors_exit("convert.py", also=(CheckpointError,)):
        from pretrained import convert
        if args.command == "to-hf":
            out, arch = convert.to_hf(args.ckpt, args.out_dir, force=args.force)
            print(f"wrote {arch} to {out}: load it with transformers.AutoModelForCausalLM.from_pretrained({str(out)!r})")
        else:
            out, about = convert.from_hf(args.src, args.out_dir, force=args.force)
            print(f"wrote an attngpt checkpoint to {out} ({about}); sample with: "
                  f"python sample.py --ckpt {shlex.quote(str(out))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
