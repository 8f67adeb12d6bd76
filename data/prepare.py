"""Prepare a corpus once into token shards, reuse it while nothing changed: `python -m data.prepare CONFIG`.

Why a fingerprint and a last-written meta.json: preparing a big corpus takes long and can be interrupted
at any point, and training must never read half-written shards. So meta.json is written last (temp
file, fsync, rename); meta.json with a matching fingerprint is the one sign of a complete prepare, and a
folder without it is resumed (document corpora, data/sharded.py) or redone (a continuous text).

The fingerprint covers the source's identity (for local text files their absolute paths; for a hub
dataset its name, config, split, column, data_files and max_docs), the name, size and sha256 of every byte of
each of its local files (data/sources.py: not modification times, so a copied data folder is still recognised
when its paths stay the same), the tokenizer, the split settings and TOKENS_VERSION (not num_proc or
streaming: they do not change the tokens). An edit anywhere in a local file is a changed corpus, and its
folder is prepared again (once also a folder from when only each file's first and last MiB were hashed:
`_reusable_as_sampled`). A hub dataset's content is not fingerprinted (only what names it): pass `--force`
after it changed.

One writer, any number of readers. A complete, up-to-date folder is opened read-only (data/prepared.py:
no lock, nothing written, so it works on a read-only mount); only when it must be (re)made does a
prepare take the folder's lock (`prepared/<folder>.lock`), check again, and write. Opening checks every
id against the tokenizer: a damaged folder is prepared again by the writer, refused by a reader.

Layout, in the data folder (see data/sources.py):
    prepared/<label>-<tokenizer>-<hash of settings>/
        train_00000.bin, ..., val_00000.bin, ...   flat token ids, uint16 when the vocabulary fits, else uint32
        meta.json   the shards of each split in order (file, tokens, max id), tokenizer (JSON), dtype, token
                    counts, source, fingerprint, split rule
        .work/      only while a prepare is unfinished: its plan, finished parts, the local datasets cache
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from common import console
from common.config_io import apply_overrides, coerce, from_dict, load_yaml
from common.errors import ArgumentParser, UserError, user_errors_exit
from common.writes import write_file
from data.config import DataConfig
from data.corpus import Corpus
from data.pipeline import EncodeSettings, bin_dtype, datasets_progress, write_text_shards
from data.prepared import LAYOUT_VERSION, META_FILE, SPLITS, PreparedData, load_prepared  # noqa: F401 (re-exported)
from data.sharded import WORK, encode_documents_sharded, read_plan, start_over, write_json_atomic
from data.sources import (DATA_DIR_ENV, content_hash, data_dir, load_rows, resolve_corpus, sampled_file_stats,
                          slugify)
from data.splitting import text_split_point
from data.tokenizer import CharTokenizer, TiktokenTokenizer, Tokenizer, stored_tokenizer

PROG = "data.prepare"
# version of the token streams (what is encoded, and how): in the fingerprint and the folder name. The
# file layout has its own version (data/prepared.py), so folders of an older layout with the same tokens
# are still found and read.
TOKENS_VERSION = 1


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


def fingerprint(cfg: DataConfig, corpus: Corpus, tokenizer: Tokenizer | None = None,
                files: list[list[Any]] | None = None) -> tuple[str, str]:
    """(folder name, fingerprint): the folder is fixed by the settings, the fingerprint adds the local
    files' names, sizes and content hashes (or `files`, entries of another kind)."""
    name = tokenizer_identity(tokenizer) if tokenizer is not None else cfg.tokenizer
    settings = {"format_version": TOKENS_VERSION, "corpus": corpus.identity, "tokenizer": name,
                "val_fraction": cfg.val_fraction}
    folder = f"{corpus.label}-{slugify(name)}-{content_hash(settings)[:10]}"
    return folder, content_hash({**settings, "files": corpus.file_stats if files is None else files})


def prepare_data(cfg: DataConfig, *, block_size: int | None = None, quiet: bool = False,
                 force: bool = False, tokenizer: Tokenizer | None = None) -> PreparedData:
    """Prepared shards for `cfg`: reused when complete and up to date, else (re)made. Bad input -> UserError.
    tokenizer: encode with this one (a pretrained model's, train.init_from) instead of cfg.tokenizer's."""
    if not prepared_root().is_dir():  # first: a data folder that cannot exist fails before any download
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
    prepared, unusable = (None, None) if force else _reusable(out_dir, fp)  # a reader's look: nothing written
    if prepared is None and unusable is None and not force and not os.access(prepared_root(), os.W_OK):
        prepared = _reusable_as_sampled(cfg, corpus, tokenizer, out_dir, quiet)
    if prepared is None:
        with _exclusive(out_dir, quiet, unusable):
            prepared, unusable = (None, None) if force else _reusable(out_dir, fp)  # made meanwhile by another?
            if unusable and not quiet:
                print(f"{out_dir.name} cannot be used ({unusable}); preparing it again", file=sys.stderr)
            if prepared is None:
                prepared = _prepare(cfg, corpus, fp, out_dir, quiet, force, tokenizer)
    if block_size is not None:
        prepared.check_block_size(block_size)
    return prepared


def _reusable(out_dir: Path, fp: str) -> tuple[PreparedData | None, str | None]:
    """(the folder opened read-only, None) if it is complete, intact and of this fingerprint; else (None,
    why a complete folder cannot be used, or None when there is no complete folder of this fingerprint)."""
    if not (out_dir / META_FILE).is_file():
        return None, None
    try:
        prepared = load_prepared(out_dir)
    except UserError as e:
        return None, str(e)
    if prepared.meta.get("fingerprint") != fp:
        return None, None
    prepared.reused = True
    return prepared, None


def _reusable_as_sampled(cfg: DataConfig, corpus: Corpus, tokenizer: Tokenizer | None, out_dir: Path,
                         quiet: bool) -> PreparedData | None:
    """Where the data folder cannot be written (a read-only mount), a folder prepared when the fingerprint
    hashed only the first and last MiB of each file, and whose files match by that: reused as it is, with a
    warning (the one writer prepares it again, once, wherever it can write)."""
    prepared, _ = _reusable(out_dir, fingerprint(cfg, corpus, tokenizer, sampled_file_stats(corpus.local_files))[1])
    if prepared is not None and not quiet:
        print(f"warning: {out_dir.name} was prepared when only the first and last MiB of each file were compared, "
              f"and this data folder is not writable: it is used as it is; run `python -m data.prepare` where it "
              f"is writable to compare every byte", file=sys.stderr)
    return prepared


def _prepare(cfg: DataConfig, corpus: Corpus, fp: str, out_dir: Path, quiet: bool, force: bool,
             fixed: Tokenizer | None = None) -> PreparedData:
    _no_readers(out_dir)
    settings = EncodeSettings(cfg.tokenizer, cfg.val_fraction, cfg.num_proc, quiet, fixed)
    with datasets_progress(not quiet):
        if corpus.kind == "documents":
            meta, tok = _prepare_documents(cfg, corpus, fp, out_dir, force, settings)
        else:
            meta, tok = _prepare_text(cfg, corpus, fp, out_dir, settings)
    for name, content in stored_tokenizer(tok)[1].items():  # a tokenizer.json sits beside meta.json
        write_file(out_dir / name, content)
    write_json_atomic(out_dir / META_FILE, meta)  # the folder is complete from here on
    shutil.rmtree(out_dir / WORK, ignore_errors=True)
    return load_prepared(out_dir)


def _prepare_documents(cfg: DataConfig, corpus: Corpus, fp: str, out_dir: Path, force: bool,
                       settings: EncodeSettings) -> tuple[dict[str, Any], Tokenizer]:
    """Documents: encoded part by part in num_proc processes, resumed where an interrupted prepare stopped."""
    if force or read_plan(out_dir).get("fingerprint") != fp:
        start_over(out_dir, {"fingerprint": fp})
    cache_dir = data_dir() / "hf" if corpus.remote else out_dir / WORK / "hf"  # keep hub downloads only
    rows = load_rows(corpus, cache_dir, cfg.num_proc)
    result = encode_documents_sharded(corpus, rows, cache_dir, fp, out_dir, settings)
    return _meta(cfg, corpus, fp, result.tokenizer, result.counts, result.shards, parts=result.parts), result.tokenizer


def _prepare_text(cfg: DataConfig, corpus: Corpus, fp: str, out_dir: Path,
                  settings: EncodeSettings) -> tuple[dict[str, Any], Tokenizer]:
    """A continuous text: encoded into a work folder, whose shards move in once all are written."""
    if out_dir.exists():  # start from an empty folder: meta.json goes first, so nothing here is trusted
        (out_dir / META_FILE).unlink(missing_ok=True)
        shutil.rmtree(out_dir)
    work_dir = out_dir / WORK
    work_dir.mkdir(parents=True)
    try:
        rows = load_rows(corpus, work_dir / "hf")
        tok, counts, shards = write_text_shards(corpus, rows, work_dir, settings)
        del rows
        for entry in (e for split in SPLITS for e in shards[split]):
            os.replace(work_dir / entry["file"], out_dir / entry["file"])
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    return _meta(cfg, corpus, fp, tok, counts, shards, parts=1), tok


def _meta(cfg: DataConfig, corpus: Corpus, fp: str, tok: Any, counts: Any, shards: dict[str, list[dict]],
          parts: int) -> dict[str, Any]:
    """meta.json of a finished prepare. The split rule follows from the corpus, the val fraction and, for a
    text, its length (counts.characters), so it is derived here rather than passed in."""
    return {
        "format_version": LAYOUT_VERSION,
        "fingerprint": fp,
        "source": corpus.description,
        "corpus": corpus.identity,
        "files": corpus.file_stats,
        "tokenizer": stored_tokenizer(tok)[0],
        "vocab_size": tok.vocab_size,
        "dtype": bin_dtype(tok.vocab_size).name,
        "train_tokens": counts.tokens["train"],
        "val_tokens": counts.tokens["val"],
        "max_id": max(e["max_id"] for split in SPLITS for e in shards[split]),
        "shards": shards,
        "parts": parts,
        "val_fraction": cfg.val_fraction,
        "split_rule": _split_rule(corpus, cfg.val_fraction, counts.characters),
        "documents": counts.documents or None,
        "characters": counts.characters or None,
        "config": dataclasses.asdict(cfg),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _split_rule(corpus: Corpus, val_fraction: float, characters: int) -> str:
    if corpus.kind == "text":
        return (f"characters [0, {text_split_point(characters, val_fraction)}) train, the rest val "
                f"(int(n_chars * (1 - {val_fraction})))")
    return f"document i is val when floor((i+1)*{val_fraction}) > floor(i*{val_fraction})"


def _no_readers(out_dir: Path) -> None:
    """Refuse to remake `out_dir` while a training run reads it (data/prepared.py: `reading`): the run opens
    the shards again for every batch, and would die on the first one deleted or read another corpus."""
    try:
        import fcntl
        fd = os.open(out_dir / META_FILE, os.O_RDONLY)
    except (ImportError, OSError):  # not POSIX, or no complete folder: no run can be reading it
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released at once: _exclusive serialises the writers
    except BlockingIOError:
        raise UserError(f"the prepared data '{out_dir}' is being read by a training run: let it finish (or stop "
                        f"it) before preparing it again, or set {DATA_DIR_ENV} to another data folder") from None
    finally:
        os.close(fd)


@contextmanager
def _exclusive(out_dir: Path, quiet: bool, unusable: str | None = None) -> Iterator[None]:
    """One writer per folder at a time (e.g. several DDP ranks starting together); the others then reuse it.
    The lock is an flock on prepared/<folder>.lock: the kernel releases it when the holder exits, however."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    try:
        lock = open(out_dir.parent / f"{out_dir.name}.lock", "w")
    except OSError as e:
        if unusable:  # a reader that cannot repair what it found: say what it found
            raise UserError(f"{unusable} (and '{out_dir.parent}' is not writable here: {e.strerror or e})") from None
        raise UserError(f"cannot prepare '{out_dir}' ({e.strerror or e}): the data folder is not writable; set "
                        f"{DATA_DIR_ENV} to a writable folder, or prepare the data where it is writable") from None
    with lock:
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


# --- command line ---------------------------------------------------------------------------------------

@dataclasses.dataclass
class _ModelSection:
    block_size: int | None = None


@dataclasses.dataclass
class _ReadSections:
    """What data.prepare reads of a run config, the schema its overrides are read with."""
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    model: _ModelSection = dataclasses.field(default_factory=_ModelSection)


def read_data_section(config_path: str, overrides: list[str]) -> tuple[DataConfig, int | None]:
    """The `data:` section as a DataConfig, and `model.block_size` if the file has one (other sections, and
    overrides of other keys, are ignored)."""
    read = [o for o in overrides if o.partition("=")[0].strip().split(".")[0] == "data"
            or o.partition("=")[0].strip() == "model.block_size"]
    raw = apply_overrides(load_yaml(config_path), read, _ReadSections)
    cfg = from_dict(DataConfig, raw.get("data"), "data.")
    model = raw.get("model")
    block_size = None
    if isinstance(model, dict) and model.get("block_size") is not None:
        block_size = coerce(int, model["block_size"], "model.block_size")
        if block_size < 1:
            raise UserError(f"'model.block_size' must be at least 1, got {block_size}")
    return cfg, block_size


def main(argv: list[str] | None = None) -> None:
    console.install(PROG)
    parser = ArgumentParser(prog=PROG, description="Tokenize the data: section of a run config into "
                                     "token shards (reused while the source and settings are unchanged; an "
                                     "interrupted prepare of documents resumes where it stopped).")
    parser.add_argument("config", help="run config YAML, e.g. configs/small.yaml")
    parser.add_argument("overrides", nargs="*", help="section.key=value, e.g. data.tokenizer=gpt2")
    parser.add_argument("--force", action="store_true", help="prepare again even if an up-to-date copy exists")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_intermixed_args(argv)  # overrides may come after a flag: CONFIG --quiet data.x=1
    with user_errors_exit(PROG):
        cfg, block_size = read_data_section(args.config, args.overrides)
        prepared = prepare_data(cfg, block_size=block_size, quiet=args.quiet, force=args.force)
        tok = prepared.tokenizer
        print(f"{'reused' if prepared.reused else 'prepared'} {prepared.meta['source']}")
        print(f"  folder:    {prepared.dir}")
        print(f"  tokenizer: {tok.name} ({tok.vocab_size} tokens), stored as {prepared.dtype.name}")
        for split in SPLITS:
            shards = prepared.split_shards(split)
            print(f"  {split + ':':10} {prepared.split_tokens(split):,} tokens in {len(shards)} shard"
                  f"{'s' * (len(shards) != 1)} ({shards[0].path.name}{' ...' if len(shards) > 1 else ''})")


if __name__ == "__main__":
    main()
