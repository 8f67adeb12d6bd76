"""Document corpora in parts: parallel workers, shards per part, the same tokens whatever num_proc or
streaming, and a killed prepare that resumes at the first unfinished part (through the real command line). A
worker's error: test_workers.py."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from common.config_io import from_dict
from data import sharded
from data.config import DataConfig
from data.prepare import prepare_data
from data.tokenizer import TiktokenTokenizer
from tests.helpers import REPO, assert_one_line_error, run_cli

N_FILES, DOCS_PER_FILE = 4, 30


def doc_text(f: int, j: int) -> str:
    return f"File {f}, document {j}: " + "the fox jumps over the dog. " * (1 + (7 * f + j) % 5)


@pytest.fixture(scope="module")
def corpus_files(tmp_path_factory) -> list[Path]:
    """N_FILES parquet files of DOCS_PER_FILE documents each, document 3 of file 1 empty."""
    import datasets

    folder = tmp_path_factory.mktemp("corpus")
    files = []
    for f in range(N_FILES):
        docs = ["" if (f, j) == (1, 3) else doc_text(f, j) for j in range(DOCS_PER_FILE)]
        path = folder / f"part{f}.parquet"
        datasets.Dataset.from_dict({"text": docs}).to_parquet(str(path))
        files.append(path)
    return files


def all_docs() -> list[str]:
    return ["" if (f, j) == (1, 3) else doc_text(f, j) for f in range(N_FILES) for j in range(DOCS_PER_FILE)]


def cfg(files: list[Path], **raw) -> DataConfig:
    return from_dict(DataConfig, {"source": "hub", "name": "parquet", "data_files": [str(f) for f in files],
                                  "tokenizer": "gpt2", **raw}, "data.")


def split_tokens(prepared, split: str) -> list[int]:
    stream = prepared.stream(split)
    return stream.read(0, stream.n_tokens).tolist()


def expected_tokens(val_fraction: float = 0.1) -> dict[str, list[int]]:
    """Independently: every non-empty document + <|endoftext|>, document i in val when i % 10 == 9."""
    enc = TiktokenTokenizer("gpt2")
    assert val_fraction == 0.1
    out: dict[str, list[int]] = {"train": [], "val": []}
    for i, doc in enumerate(all_docs()):
        if doc:
            out["val" if i % 10 == 9 else "train"] += enc.encode(doc) + [enc.eot]
    return out


def test_parts_follow_the_files_and_tokens_do_not_depend_on_num_proc_or_streaming(corpus_files, data_dir,
                                                                                   monkeypatch):
    expected = expected_tokens()
    streamed = prepare_data(cfg(corpus_files, streaming=True, num_proc=2), quiet=True)
    assert streamed.meta["parts"] == N_FILES
    assert [s.path.name for s in streamed.split_shards("train")] == [f"train_{i:05d}.bin" for i in range(N_FILES)]
    assert {s: split_tokens(streamed, s) for s in ("train", "val")} == expected
    assert streamed.meta["documents"] == {"train": 107, "val": 12}  # 120 documents, one empty, 12 in val
    # each shard is its part's documents: file 0's train documents are the first shard
    enc = TiktokenTokenizer("gpt2")
    first = [t for j in range(DOCS_PER_FILE) if j % 10 != 9 for t in enc.encode(doc_text(0, j)) + [enc.eot]]
    assert np.fromfile(streamed.split_shards("train")[0].path, dtype=np.uint16).tolist() == first
    assert all(s.max_id == int(np.fromfile(s.path, dtype=np.uint16).max()) for s in streamed.split_shards("train"))

    monkeypatch.setattr(sharded, "PART_DOCS", 7)  # an in-memory dataset is cut into runs of PART_DOCS documents
    for num_proc in (1, 2):
        in_memory = prepare_data(cfg(corpus_files, num_proc=num_proc), quiet=True, force=True)
        assert in_memory.meta["parts"] == -(-N_FILES * DOCS_PER_FILE // 7)
        assert {s: split_tokens(in_memory, s) for s in ("train", "val")} == expected, num_proc


def test_char_vocabulary_of_documents_is_scanned_in_parallel(corpus_files, data_dir):
    one = prepare_data(cfg(corpus_files, streaming=True, tokenizer="char"), quiet=True)
    two = prepare_data(cfg(corpus_files, streaming=True, tokenizer="char", num_proc=2), quiet=True, force=True)
    assert one.tokenizer.to_json() == two.tokenizer.to_json()
    assert set(one.tokenizer.chars) == set("".join(all_docs())) | {"\n"}
    assert split_tokens(one, "val") == split_tokens(two, "val")
    assert one.tokenizer.decode(split_tokens(two, "val")) == "".join(
        d + "\n" for i, d in enumerate(all_docs()) if i % 10 == 9 and d)


# --- a killed prepare, through the command line ---------------------------------------------------------------

def write_config(tmp_path: Path, files: list[Path]) -> Path:
    path = tmp_path / "docs.yaml"
    path.write_text("data:\n  source: hub\n  name: parquet\n  streaming: true\n  tokenizer: gpt2\n  data_files:\n"
                    + "".join(f"    - {f}\n" for f in files), encoding="utf-8")
    return path


def test_killed_prepare_resumes_at_the_first_unfinished_part(corpus_files, tmp_path):
    config = write_config(tmp_path, corpus_files)
    env = {"ATTNGPT_DATA_DIR": str(tmp_path / "data")}
    killed = run_cli(["-m", "data.prepare", str(config), "--quiet", "data.num_proc=2"],
                     env_extra={**env, sharded.TEST_KILL_ENV: "2"})  # SIGKILLed once parts 0 and 1 are done
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    prepared = tmp_path / "data" / "prepared"
    folder = next(prepared.glob("*/.work")).parent
    assert not (folder / "meta.json").exists()
    kept = {name: (folder / name).stat().st_mtime_ns for name in ("train_00000.bin", "train_00001.bin")}
    (folder / ".train_00002.bin.tmp").write_bytes(b"\1\0" * 3)  # partial files a kill may leave
    (folder / ".work" / ".part_00003.ids.tmp").write_bytes(b"\1\0" * 3)
    with open(folder / "train_00001.bin", "r+b") as f:  # a done part whose shard was damaged since: redone
        f.truncate(4)
    resumed = run_cli(["-m", "data.prepare", str(config), "data.num_proc=2"], env_extra=env)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert re.search(r"resuming the interrupted prepare of .*: 1 of 4 parts done, [0-2] encoded", resumed.stderr)
    assert "tok/s" in resumed.stderr and "120/120" in resumed.stderr  # progress: tokens/s, documents of a known total
    assert (folder / "train_00000.bin").stat().st_mtime_ns == kept["train_00000.bin"]  # not encoded again
    assert not list(folder.glob(".*.tmp")) and not (folder / ".work").exists()
    meta = json.loads((folder / "meta.json").read_text())
    tokens = {split: np.concatenate([np.fromfile(folder / e["file"], dtype=np.uint16) for e in meta["shards"][split]])
              .tolist() for split in ("train", "val")}
    assert tokens == expected_tokens()


def test_overrides_after_a_flag_and_reuse_on_a_read_only_mount(corpus_files, tmp_path):
    """`CONFIG --quiet data.x=...` parses; a complete folder mounted read-only opens without writing
    anything (no lock file); a damaged one there is refused with one line naming the shard."""
    config = write_config(tmp_path, corpus_files)
    data = tmp_path / "data"
    env = {"ATTNGPT_DATA_DIR": str(data)}
    first = run_cli(["-m", "data.prepare", str(config), "--quiet", "data.val_fraction=0.2"], env_extra=env)
    assert first.returncode == 0, first.stderr
    for lock in (data / "prepared").glob("*.lock"):
        lock.unlink()
    before = snapshot(data)
    again = run_read_only(data, ["-m", "data.prepare", str(config), "--quiet", "data.val_fraction=0.2"], env)
    assert again.returncode == 0 and again.stdout.startswith("reused "), again.stderr
    assert snapshot(data) == before  # nothing created, renamed or touched: no lock file either
    shard = next((data / "prepared").glob("*/train_00002.bin"))
    ids = np.memmap(shard, dtype=np.uint16, mode="r+")
    ids[5] = 50300  # past GPT-2's 50257 ids
    ids.flush()
    del ids
    refused = run_read_only(data, ["-m", "data.prepare", str(config), "--quiet", "data.val_fraction=0.2"], env)
    assert_one_line_error(refused, "data.prepare", "train_00002.bin' holds token id 50300", "only 50257 ids",
                          "--force")
    repaired = run_cli(["-m", "data.prepare", str(config), "data.val_fraction=0.2"], env_extra=env)
    assert repaired.returncode == 0 and "cannot be used" in repaired.stderr and "preparing it again" in repaired.stderr
    assert int(np.fromfile(shard, dtype=np.uint16).max()) < 50257


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*"))}


def run_read_only(folder: Path, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run a command line with `folder` mounted read-only (a private mount namespace, as root), or with its
    write permissions removed (as another user, where chmod is enough)."""
    if os.geteuid() != 0:
        modes = {p: p.stat().st_mode for p in [folder, *folder.rglob("*")]}
        for p in modes:
            p.chmod(modes[p] & ~0o222)
        try:
            return run_cli(args, env_extra=env)
        finally:
            for p, mode in modes.items():
                p.chmod(mode)
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount --bind -o ro '{folder}' '{folder}'"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount read-only here (root without mount namespaces): {probe.stderr[-200:]!r}")
    return subprocess.run(["unshare", "-m", "sh", "-c", f"mount --bind -o ro '{folder}' '{folder}' && exec \"$0\" \"$@\"",
                           sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "WANDB_MODE": "disabled", **env})


def test_a_done_record_is_trusted_only_as_split_part_writes_it(tmp_path):
    """A resume skips a part whose done record checks out; one that names another file, or holds counts that
    are not whole numbers, is not trusted (the part is encoded again), whatever is on disk."""
    work, dtype = tmp_path / sharded.WORK, np.dtype(np.uint16)
    work.mkdir()
    ids_path, lens_path = sharded._part_paths(work, 3)
    np.arange(1, 13, dtype=dtype).tofile(ids_path)
    np.array([4] * 3, dtype=np.uint32).tofile(lens_path)  # three documents of 4 ids
    record = sharded.split_part(3, 0, work, tmp_path, dtype, val_fraction=0.34)
    assert set(record["shards"]) == {"train", "val"} and all(record["shards"].values())
    assert sharded._done_record(work, tmp_path, 3, dtype) == record
    assert sharded._done_record(work, tmp_path, 2, dtype) is None  # another part's record name
    (tmp_path / "elsewhere.bin").write_bytes((tmp_path / record["shards"]["train"]["file"]).read_bytes())

    def damaged(change) -> dict | None:
        copy = json.loads(json.dumps(record))
        change(copy)
        (work / "done_00003.json").write_text(json.dumps(copy), encoding="utf-8")
        return sharded._done_record(work, tmp_path, 3, dtype)

    damages = {
        "another part": lambda r: r.update(part=4),
        "a file that is not the part's shard": lambda r: r["shards"]["train"].update(file="elsewhere.bin"),
        "a path out of the folder": lambda r: r["shards"]["train"].update(file=f"../{tmp_path.name}/elsewhere.bin"),
        "tokens as text": lambda r: r["shards"]["train"].update(tokens=str(r["shards"]["train"]["tokens"])),
        "tokens as a float": lambda r: r["shards"]["train"].update(tokens=float(r["shards"]["train"]["tokens"])),
        "max_id missing": lambda r: r["shards"]["val"].pop("max_id"),
        "max_id negative": lambda r: r["shards"]["val"].update(max_id=-1),
        "docs negative": lambda r: r.update(docs=-3),
        "docs a bool": lambda r: r.update(docs=True),
        "documents missing a split": lambda r: r["documents"].pop("val"),
        "a third split": lambda r: r["shards"].update(test=None),
        "shards as a list": lambda r: r.update(shards=[]),
        "size not the file's": lambda r: r["shards"]["val"].update(tokens=r["shards"]["val"]["tokens"] + 1),
    }
    for what, change in damages.items():
        assert damaged(change) is None, what
    assert damaged(lambda r: None) == record  # the writes above restored nothing by accident
