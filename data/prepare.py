"""Prepare a corpus once into token bins, reuse it while nothing changed: `python -m data.prepare CONFIG`.

Why a fingerprint and a last-written meta.json: preparing a big corpus takes long and can be interrupted
at any point, and training must never read half-written bins. So a prepare writes into a work folder,
moves the finished bins into place, and only then writes meta.json (temp file, fsync, rename). meta.json
with a matching fingerprint is the one sign of a complete prepare; a folder without it is redone.

The fingerprint covers the source's identity, the size and mtime of its local files, the tokenizer,
the split settings and FORMAT_VERSION (not num_proc or streaming: they do not change the output).
A hub dataset's content is not fingerprinted — pass `--force` after it changed.

Layout, in the data folder (see data/sources.py):
    prepared/<label>-<tokenizer>-<hash of settings>/
        train.bin, val.bin   one flat stream of token ids each, uint16 when the vocabulary fits, else uint32
        meta.json            tokenizer (JSON), dtype, token counts, source, fingerprint, split rule
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import shutil
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from common.config_io import apply_overrides, coerce, from_dict, load_yaml
from common.errors import ArgumentParser, UserError, user_errors_exit
from data.config import DataConfig
from data.pipeline import bin_dtype, datasets_progress, write_bins
from data.sources import DATA_DIR_ENV, Corpus, content_hash, slugify, data_dir, load_rows, resolve_corpus
from data.splitting import text_split_point
from data.tokenizer import CharTokenizer, TiktokenTokenizer, Tokenizer, stored_tokenizer, tokenizer_from_json

PROG = "data.prepare"
FORMAT_VERSION = 1
META_FILE = "meta.json"
SPLITS = ("train", "val")


@dataclass
class PreparedData:
    """A complete prepared folder: where the bins are, how to read them, and how to decode them."""

    dir: Path
    meta: dict[str, Any]
    tokenizer: Tokenizer
    dtype: np.dtype
    train_path: Path
    val_path: Path
    train_tokens: int
    val_tokens: int
    reused: bool = False  # True when an earlier prepare was found complete and up to date

    def split_path(self, split: str) -> Path:
        if split not in SPLITS:
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        return self.train_path if split == "train" else self.val_path

    def split_tokens(self, split: str) -> int:
        self.split_path(split)
        return self.train_tokens if split == "train" else self.val_tokens

    def check_block_size(self, block_size: int) -> None:
        """Every split must hold at least one window of block_size + 1 tokens."""
        for split in SPLITS:
            n = self.split_tokens(split)
            if n < block_size + 1:
                share = "raise data.val_fraction" if split == "val" else "lower data.val_fraction"
                raise UserError(f"the {split} split has {n} tokens but block_size {block_size} needs at least "
                                f"{block_size + 1}: lower model.block_size, {share}, or use more data")


def prepared_root() -> Path:
    return data_dir() / "prepared"


def tokenizer_identity(tok: Tokenizer) -> str:
    """What names a given (pretrained) tokenizer in the fingerprint: a tiktoken encoding by its name (so its
    data is shared with `data.tokenizer: <name>`), a fixed char vocabulary or a tokenizer.json by content."""
    if isinstance(tok, TiktokenTokenizer):
        return tok.name
    if isinstance(tok, CharTokenizer):
        return "char-" + content_hash(tok.chars)[:16]
    return "hf-" + tok.to_json()["sha256"][:16]


def fingerprint(cfg: DataConfig, corpus: Corpus, tokenizer: Tokenizer | None = None) -> tuple[str, str]:
    """(folder name, fingerprint): the folder is fixed by the settings, the fingerprint adds file sizes/mtimes."""
    name = tokenizer_identity(tokenizer) if tokenizer is not None else cfg.tokenizer
    settings = {"format_version": FORMAT_VERSION, "corpus": corpus.identity, "tokenizer": name,
                "val_fraction": cfg.val_fraction}
    folder = f"{corpus.label}-{slugify(name)}-{content_hash(settings)[:10]}"
    return folder, content_hash({**settings, "files": corpus.file_stats})


def prepare_data(cfg: DataConfig, *, block_size: int | None = None, quiet: bool = False,
                 force: bool = False, tokenizer: Tokenizer | None = None) -> PreparedData:
    """Prepared bins for `cfg`: reused when complete and up to date, else (re)made. Bad input -> UserError.
    tokenizer: encode with this one (a pretrained model's, train.init_from) instead of cfg.tokenizer's."""
    try:
        prepared_root().mkdir(parents=True, exist_ok=True)  # e.g. ATTNGPT_DATA_DIR below a regular file
    except OSError as e:
        raise UserError(f"cannot create the data folder '{prepared_root()}' ({e.strerror or e}): set "
                        f"{DATA_DIR_ENV} to a writable folder") from None
    corpus = resolve_corpus(cfg, quiet)
    if cfg.tokenizer != "char" and tokenizer is None:
        TiktokenTokenizer(cfg.tokenizer)  # fail before reading the corpus if the encoding cannot load
    folder, fp = fingerprint(cfg, corpus, tokenizer)
    out_dir = prepared_root() / folder
    with _exclusive(out_dir, quiet):
        prepared = None if force else _reusable(out_dir, fp)
        if prepared is None:
            prepared = _prepare(cfg, corpus, fp, out_dir, quiet, tokenizer)
    if block_size is not None:
        prepared.check_block_size(block_size)
    return prepared


def _reusable(out_dir: Path, fp: str) -> PreparedData | None:
    try:
        prepared = load_prepared(out_dir)
    except UserError:
        return None
    if prepared.meta.get("fingerprint") != fp:
        return None
    prepared.reused = True
    return prepared


def _prepare(cfg: DataConfig, corpus: Corpus, fp: str, out_dir: Path, quiet: bool,
             tokenizer: Tokenizer | None = None) -> PreparedData:
    # start from an empty folder: meta.json goes first, so nothing here is trusted until we finish
    if out_dir.exists():
        (out_dir / META_FILE).unlink(missing_ok=True)
        shutil.rmtree(out_dir)
    work_dir = out_dir / ".work"
    work_dir.mkdir(parents=True)
    try:
        cache_dir = data_dir() / "hf" if corpus.remote else work_dir / "hf"  # keep hub downloads only
        with datasets_progress(not quiet):
            rows = load_rows(corpus, cache_dir)
            tok, counts = write_bins(corpus, rows, cfg.tokenizer, cfg.val_fraction, work_dir, cfg.num_proc, quiet,
                                     fixed=tokenizer)
            del rows
        for split in SPLITS:
            os.replace(work_dir / f"{split}.bin", out_dir / f"{split}.bin")
        tokenizer_spec, tokenizer_files = stored_tokenizer(tok)  # a tokenizer.json sits beside meta.json
        for name, content in tokenizer_files.items():
            (out_dir / name).write_bytes(content)
        meta = {
            "format_version": FORMAT_VERSION,
            "fingerprint": fp,
            "source": corpus.description,
            "corpus": corpus.identity,
            "files": corpus.file_stats,
            "tokenizer": tokenizer_spec,
            "vocab_size": tok.vocab_size,
            "dtype": bin_dtype(tok.vocab_size).name,
            "train_tokens": counts.tokens["train"],
            "val_tokens": counts.tokens["val"],
            "val_fraction": cfg.val_fraction,
            "split_rule": _split_rule(corpus, cfg.val_fraction, counts.characters),
            "documents": counts.documents or None,
            "characters": counts.characters or None,
            "config": dataclasses.asdict(cfg),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        write_json_atomic(out_dir / META_FILE, meta)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    return load_prepared(out_dir)


def _split_rule(corpus: Corpus, val_fraction: float, characters: int) -> str:
    if corpus.kind == "text":
        return (f"characters [0, {text_split_point(characters, val_fraction)}) train, the rest val "
                f"(int(n_chars * (1 - {val_fraction})))")
    return f"document i is val when floor((i+1)*{val_fraction}) > floor(i*{val_fraction})"


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON so that `path` is either the old file or the whole new one, even across a crash."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


@contextmanager
def _exclusive(out_dir: Path, quiet: bool) -> Iterator[None]:
    """One prepare per folder at a time (e.g. several DDP ranks starting together); the others then reuse it."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    with open(out_dir.parent / f"{out_dir.name}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not quiet:
                print(f"waiting for another process preparing {out_dir} ...", file=sys.stderr)
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def load_prepared(directory: str | Path) -> PreparedData:
    """Open a prepared folder, checking that it is complete (meta.json present, bins of the recorded size)."""
    directory = Path(directory)
    redo = "run `python -m data.prepare CONFIG` to prepare it again"
    meta_path = directory / META_FILE
    if not meta_path.is_file():
        raise UserError(f"'{directory}' is not a complete prepared data folder (no {META_FILE}): {redo}")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UserError(f"'{meta_path}' is not valid JSON: {redo}") from None
    if not isinstance(meta, dict) or meta.get("format_version") != FORMAT_VERSION:
        raise UserError(f"'{meta_path}' is from another format version (want {FORMAT_VERSION}): {redo}")
    if meta.get("dtype") not in ("uint16", "uint32"):
        raise UserError(f"'{meta_path}' names dtype {meta.get('dtype')!r}, not uint16 or uint32: {redo}")
    dtype = np.dtype(meta["dtype"])
    for split in SPLITS:
        path, tokens = directory / f"{split}.bin", meta.get(f"{split}_tokens")
        if not isinstance(tokens, int) or not path.is_file() or path.stat().st_size != tokens * dtype.itemsize:
            raise UserError(f"'{path}' is missing or does not hold the {tokens} tokens meta.json records: {redo}")
    tokenizer = tokenizer_from_json(meta.get("tokenizer"), base_dir=directory)
    return PreparedData(dir=directory, meta=meta, tokenizer=tokenizer, dtype=dtype,
                        train_path=directory / "train.bin", val_path=directory / "val.bin",
                        train_tokens=meta["train_tokens"], val_tokens=meta["val_tokens"])


# --- command line ---------------------------------------------------------------------------------------

def read_data_section(config_path: str, overrides: list[str]) -> tuple[DataConfig, int | None]:
    """The `data:` section as a DataConfig, and `model.block_size` if the file has one (other sections ignored)."""
    raw = apply_overrides(load_yaml(config_path), overrides)
    cfg = from_dict(DataConfig, raw.get("data"), "data.")
    model = raw.get("model")
    block_size = None
    if isinstance(model, dict) and model.get("block_size") is not None:
        block_size = coerce(int, model["block_size"], "model.block_size")
        if block_size < 1:
            raise UserError(f"'model.block_size' must be at least 1, got {block_size}")
    return cfg, block_size


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(prog=PROG, description="Tokenize the data: section of a run config into "
                                     "train.bin / val.bin (reused while the source and settings are unchanged).")
    parser.add_argument("config", help="run config YAML, e.g. configs/shakespeare_char.yaml")
    parser.add_argument("overrides", nargs="*", help="section.key=value, e.g. data.tokenizer=gpt2")
    parser.add_argument("--force", action="store_true", help="prepare again even if an up-to-date copy exists")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    with user_errors_exit(PROG):
        cfg, block_size = read_data_section(args.config, args.overrides)
        prepared = prepare_data(cfg, block_size=block_size, quiet=args.quiet, force=args.force)
        tok = prepared.tokenizer
        print(f"{'reused' if prepared.reused else 'prepared'} {prepared.meta['source']}")
        print(f"  folder:    {prepared.dir}")
        print(f"  tokenizer: {tok.name} ({tok.vocab_size} tokens), stored as {prepared.dtype.name}")
        print(f"  train.bin: {prepared.train_tokens:,} tokens")
        print(f"  val.bin:   {prepared.val_tokens:,} tokens")


if __name__ == "__main__":
    main()
