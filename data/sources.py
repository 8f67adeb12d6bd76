"""Where text comes from: the data folder, the tinyshakespeare preset, local text files, `datasets` sources and
the generated repeated sequences.

Why this module: everything that touches the outside world before tokenization lives here — finding,
sizing and hashing files (for the prepare fingerprint), the one download we do ourselves, and the single
`datasets.load_dataset(name, config, data_files=..., split=..., streaming=...)` call that reads local text,
local parquet/json/csv and hub datasets alike. Their many failure modes become one `UserError` line in
data/source_errors.py.

The data folder holds downloads, the `datasets` cache of hub datasets, and prepared bins:
`data/cache/` next to this file (git-ignored), or `$ATTNGPT_DATA_DIR` when that is set.

Two shapes of corpus:
- "text" (source tinyshakespeare, text or repeated): the files read as ONE continuous text, as `cat` would
  join them. Rows are lines with their line breaks kept (universal newlines: \\r\\n becomes \\n), so joining
  rows gives back the text exactly. The repeated source's lines are generated in memory (data/repeated.py),
  from its settings alone: they are its identity, and it has no files.
- "documents" (source hub): every row of `text_column` is one document. Empty (or null) rows are skipped.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tqdm import tqdm

from common.errors import UserError
from common.path_kind import path_kind
from common.writes import write_file
from data.config import DataConfig
from data.corpus import LOCAL_BUILDERS, Corpus
from data.repeated import REPEATED_VERSION, repeated_lines
from data.source_errors import corpus_errors

DATA_DIR_ENV = "ATTNGPT_DATA_DIR"
TINYSHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"


def data_dir() -> Path:
    """The data folder: $ATTNGPT_DATA_DIR when set, else data/cache/ beside this package."""
    env = os.environ.get(DATA_DIR_ENV, "").strip()
    return Path(env).expanduser().resolve() if env else Path(__file__).resolve().parent / "cache"


def tinyshakespeare_path() -> Path:
    return data_dir() / "tinyshakespeare" / "input.txt"


def ensure_tinyshakespeare(quiet: bool = False) -> Path:
    """The tinyshakespeare text file, downloaded into the data folder the first time it is needed."""
    target = tinyshakespeare_path()
    if target.is_file():
        return target
    def download_into(out) -> None:
        with urllib.request.urlopen(TINYSHAKESPEARE_URL, timeout=30) as response:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc="download tinyshakespeare", disable=quiet) as bar:
                while chunk := response.read(1 << 16):
                    out.write(chunk)
                    bar.update(len(chunk))

    try:
        write_file(target, download_into)  # the file appears whole or not at all
    except (OSError, ValueError) as e:  # URLError, timeouts and disk errors are all OSErrors
        reason = getattr(e, "reason", None) or e
        raise UserError(f"cannot download tinyshakespeare ({reason}): save {TINYSHAKESPEARE_URL} as {target}, "
                        f"or set {DATA_DIR_ENV} to a folder that holds tinyshakespeare/input.txt") from None
    return target


def list_text_files(paths: list[str]) -> list[Path]:
    """Files named by `data.path`: each file as given, each folder as its non-hidden files in sorted order."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw).expanduser()
        kind = path_kind(path)
        if kind.kind == "file":
            files.append(path.resolve())
        elif kind.kind == "directory":
            found = sorted(f for f in path.rglob("*")
                           if f.is_file() and not any(part.startswith(".") for part in f.relative_to(path).parts))
            if not found:
                raise UserError(f"folder '{raw}' holds no files: put text files in it, or point data.path at a file")
            files.extend(f.resolve() for f in found)
        elif kind.kind == "stream":
            raise UserError(f"data.path '{raw}' {kind.says}, not a regular file: a corpus is read more than once "
                            f"(hashed, then encoded), so save the text to a file and point data.path at it")
        else:
            raise UserError(f"data.path '{raw}' {kind.says}: point it at a text file, a folder of text files, "
                            f"or a list of files (relative paths start from {Path.cwd()})")
    return files


def _stats(files: list[Path]) -> list[list[Any]]:
    """[name, size, content hash] per file: what tells a changed corpus from the same one.

    The hash is a sha256 of the file's every byte, read in 1 MiB chunks (benchmarks/RESULTS.md: 0.16 s per 100 MB
    on a shared 2-core machine, from the page cache), so any edit, anywhere, is a changed corpus. No path and no
    modification time: the same bytes give the same entries wherever they lie and however they were copied
    (tinyshakespeare in another data folder is the same corpus; local text files are also named by their paths,
    in the corpus's identity). Folders from when only the first and last MiB were hashed: sampled_file_stats."""
    return [[f.name, f.stat().st_size, file_sha256(f)] for f in files]


def sampled_file_stats(files: list[Path]) -> list[list[Any]]:
    """The entries `_stats` made before it hashed whole files: [name, size, the first 16 hex digits of a sha256
    of the first and the last MiB]. Only to recognise folders prepared then (data/prepare.py)."""
    out = []
    for f in files:
        size, digest = f.stat().st_size, hashlib.sha256()
        with open(f, "rb") as fh:
            digest.update(fh.read(1 << 20))
            if size > 2 << 20:
                fh.seek(size - (1 << 20))
            digest.update(fh.read(1 << 20))
        out.append([f.name, size, digest.hexdigest()[:16]])
    return out


def file_sha256(path: Path, chunk_bytes: int = 1 << 20) -> str:
    """The sha256 of a file's whole content, as hex (read a chunk at a time: memory stays at one chunk)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def slugify(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._-")[:40] or "corpus"


def resolve_corpus(cfg: DataConfig, quiet: bool = False) -> Corpus:
    """Check that the source exists and describe it, without reading it (downloads tinyshakespeare if absent)."""
    if cfg.source == "tinyshakespeare":
        path = ensure_tinyshakespeare(quiet)
        return _text_corpus([path], cfg, label="tinyshakespeare", description=f"tinyshakespeare ({path})",
                            identity={"source": "tinyshakespeare"})
    if cfg.source == "text":
        files = list_text_files(cfg.text_paths())
        if sum(f.stat().st_size for f in files) == 0:
            raise UserError(f"the corpus in data.path {cfg.path!r} is empty (all {len(files)} file(s) have 0 bytes): "
                            f"point data.path at text files with content")
        first = Path(cfg.text_paths()[0])
        where = f"{files[0]}" if len(files) == 1 else f"{len(files)} files from {first.resolve()}"
        return _text_corpus(files, cfg, label=slugify(first.stem or first.name), description=f"text: {where}",
                            identity={"source": "text", "files": [str(f) for f in files]})
    if cfg.source == "repeated":
        return _resolve_repeated(cfg)
    return _resolve_hub(cfg)


def _resolve_repeated(cfg: DataConfig) -> Corpus:
    low, high = cfg.length_range()
    settings = {"alphabet_size": cfg.alphabet_size, "min_length": low, "max_length": high,
                "num_sequences": cfg.num_sequences, "seed": cfg.seed}
    lengths = f"{low}" if low == high else f"{low}-{high}"
    return Corpus(kind="text", label="repeated", description=f"repeated: {cfg.num_sequences} sequences of {lengths} "
                  f"characters from {cfg.alphabet_size}, each followed by its copy (seed {cfg.seed})",
                  identity={"source": "repeated", "version": REPEATED_VERSION, **settings},
                  streaming=cfg.streaming, repeated=settings)


def _text_corpus(files: list[Path], cfg: DataConfig, **described: Any) -> Corpus:
    """Local text files read as one text (label, description and identity given)."""
    return Corpus(kind="text", file_stats=_stats(files), local_files=files, streaming=cfg.streaming, **described,
                  load_kwargs={"path": "text", "data_files": [str(f) for f in files], "split": "train",
                               "keep_linebreaks": True})


def _resolve_hub(cfg: DataConfig) -> Corpus:
    name = str(cfg.name)
    data_files = cfg.data_file_list()
    local_files: list[Path] = []
    if name in LOCAL_BUILDERS:
        if not data_files:
            raise UserError(f"data.name '{name}' reads local files: set data.data_files to a file, a glob or a list")
        for pattern in data_files:
            if "://" in pattern:
                continue
            matches = [Path(m) for m in sorted(glob.glob(os.path.expanduser(pattern), recursive=True))]
            if not any(m.is_file() for m in matches):
                raise UserError(f"data.data_files '{pattern}' matches no file: give existing {name} file(s) "
                                f"(relative paths start from {Path.cwd()})")
            local_files.extend(m.resolve() for m in matches if m.is_file())
        data_files = [p if "://" in p else str(Path(p).expanduser().resolve()) for p in data_files]
    elif Path(name).expanduser().is_dir():  # a local dataset folder
        local_files = sorted(f.resolve() for f in Path(name).expanduser().rglob("*") if f.is_file())
        name = str(Path(name).expanduser().resolve())
    remote = name not in LOCAL_BUILDERS and not Path(name).is_dir()
    identity = {"source": "hub", "name": name, "config_name": cfg.config_name, "data_files": data_files,
                "split": cfg.split, "text_column": cfg.text_column, "max_docs": cfg.max_docs}
    load_kwargs: dict[str, Any] = {"path": name, "name": cfg.config_name, "split": cfg.split}
    label = name if name not in LOCAL_BUILDERS else f"{name}-{Path(data_files[0]).stem}"  # type: ignore[index]
    files = None
    if data_files:
        load_kwargs["data_files"] = data_files
        files = data_files[0] if len(data_files) == 1 else f"{data_files[0]} and {len(data_files) - 1} more"
    where = ", ".join(f"{k} {v}" for k, v in (("files", files), ("config", cfg.config_name), ("split", cfg.split),
                                               ("column", cfg.text_column)) if v)
    return Corpus(kind="documents", label=slugify(label.rstrip("/").split("/")[-1]),
                  description=f"hub: {name} ({where})", identity=identity, file_stats=_stats(local_files),
                  load_kwargs=load_kwargs, local_files=local_files, remote=remote, text_column=cfg.text_column,
                  streaming=cfg.streaming, max_docs=cfg.max_docs)


def content_hash(obj: Any) -> str:
    """sha256 of a JSON-able object (stable key order)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


# --- loading through `datasets` ---------------------------------------------------------------------------

def load_rows(corpus: Corpus, cache_dir: Path, num_proc: int = 1) -> Any:
    """The corpus as a `datasets` Dataset (or IterableDataset when streaming) with one string column "text".
    num_proc > 1 lets `datasets` download and convert a non-streamed document corpus's files in parallel."""
    import datasets

    if corpus.repeated is not None:  # generated, not read: the lines themselves, in memory
        rows = datasets.Dataset.from_dict({"text": repeated_lines(**corpus.repeated)})
        return rows.to_iterable_dataset() if corpus.streaming else rows
    kwargs = dict(corpus.load_kwargs, cache_dir=str(cache_dir), streaming=corpus.streaming)
    if num_proc > 1 and not corpus.streaming and corpus.kind == "documents":
        kwargs["num_proc"] = num_proc
    if corpus.kind == "text":
        kwargs["features"] = datasets.Features({"text": datasets.Value("string")})
    with corpus_errors(corpus, cache_dir, reading=False):
        rows = datasets.load_dataset(**kwargs)
        if isinstance(rows, (datasets.DatasetDict, datasets.IterableDatasetDict)):
            raise UserError(f"{corpus.description} gave several splits ({', '.join(rows)}): set data.split to one")
        columns = rows.column_names  # None: a stream whose features are unknown until its first row is read
        columns = list(columns) if columns is not None else list(next(iter(rows), None) or [])
    column = corpus.text_column
    if column not in columns:
        raise UserError(f"{corpus.description} has no column '{column}' (columns: {', '.join(columns) or 'none'}): "
                        f"set data.text_column to the one that holds the text")
    feature = (rows.features or {}).get(column)
    if feature is not None and getattr(feature, "dtype", None) not in ("string", "large_string"):
        raise UserError(f"column '{column}' of {corpus.description} holds {feature}, not text: "
                        f"set data.text_column to a string column")
    rows = rows.select_columns([column])
    if column != "text":
        rows = rows.rename_column(column, "text")
    if corpus.max_docs is not None:
        rows = rows.take(corpus.max_docs) if corpus.streaming else rows.select(range(min(corpus.max_docs, len(rows))))
    return rows
