"""What the prepare fingerprint covers (data/prepare.py, data/sources.py: `_stats`): every byte of a local corpus,
so an edit anywhere is prepared again, never trained on as the old tokens; folders fingerprinted the older way
(first and last MiB) are prepared again once. Then generated damage to a prepared folder and its corpus: the
writer ends with shards equal to the corpus as it is now, or one UserError line; it never trusts stale tokens."""
from __future__ import annotations

import hashlib
import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.config_io import from_dict
from common.errors import UserError
from data.config import DataConfig
from data.prepare import META_FILE, fingerprint, prepare_data
from data.sources import content_hash, resolve_corpus, sampled_file_stats
from tests.helpers import assert_one_line_error
from tests.data.test_sharded import run_read_only, snapshot


def text_config(path: Path) -> DataConfig:
    return from_dict(DataConfig, {"source": "text", "path": str(path)}, "data.")


def decoded(prepared) -> str:
    """The text the prepared shards hold, both splits in order."""
    out = []
    for split in ("train", "val"):
        stream = prepared.stream(split)
        out.append(prepared.tokenizer.decode(stream.read(0, stream.n_tokens).tolist()))
    return "".join(out)


def corpus_text(n_chars: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    words = ["the", "fox", "jumps", "over", "a", "lazy", "dog", "and", "runs", "far", "away", "home"]
    text, length = [], 0
    while length < n_chars:
        text.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) + ".\n")
        length += len(text[-1])
    return "".join(text)[:n_chars]


def test_a_one_byte_edit_in_the_middle_of_a_large_file_is_prepared_again(tmp_path, monkeypatch):
    """3 MB: the edit lies beyond the first and last MiB, which is all the fingerprint used to read."""
    monkeypatch.setenv("ATTNGPT_DATA_DIR", str(tmp_path / "data"))
    path = tmp_path / "corpus.txt"
    text = corpus_text(3_000_000)
    path.write_text(text, encoding="utf-8")
    first = prepare_data(text_config(path), quiet=True)
    middle = len(text) // 2
    edited = text[:middle] + ("a" if text[middle] != "a" else "o") + text[middle + 1:]
    path.write_text(edited, encoding="utf-8")  # the same size, the same first and last MiB
    again = prepare_data(text_config(path), quiet=True)
    assert not again.reused and again.dir == first.dir
    assert decoded(again) == edited != text
    assert prepare_data(text_config(path), quiet=True).reused


def _old_stats(files: list[Path]) -> list[list]:
    """The fingerprint entries before it covered the whole content: name, size, sha256 of the first and last MiB."""
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


def _make_old_style(tmp_path: Path, monkeypatch) -> tuple[DataConfig, Path, object, str]:
    """A prepared folder whose meta.json fingerprints its corpus the older way; (config, corpus, the folder, the
    fingerprint a prepare computes now)."""
    monkeypatch.setenv("ATTNGPT_DATA_DIR", str(tmp_path / "data"))
    path = tmp_path / "corpus.txt"
    path.write_text(corpus_text(20_000), encoding="utf-8")
    cfg = text_config(path)
    prepared = prepare_data(cfg, quiet=True)
    corpus = resolve_corpus(cfg, quiet=True)
    _, fp_now = fingerprint(cfg, corpus)
    settings_part = {"format_version": 1, "corpus": corpus.identity, "tokenizer": "char", "val_fraction": 0.1}
    assert content_hash({**settings_part, "files": corpus.file_stats}) == fp_now  # the recipe this test copies
    assert sampled_file_stats([path]) == _old_stats([path])
    meta = json.loads((prepared.dir / META_FILE).read_text())
    meta["fingerprint"], meta["files"] = content_hash({**settings_part, "files": _old_stats([path])}), _old_stats([path])
    (prepared.dir / META_FILE).write_text(json.dumps(meta))
    return cfg, path, prepared, fp_now


def test_a_folder_fingerprinted_the_older_way_is_prepared_again_once(tmp_path, monkeypatch):
    cfg, path, prepared, fp_now = _make_old_style(tmp_path, monkeypatch)
    again = prepare_data(cfg, quiet=True)
    assert not again.reused and again.dir == prepared.dir and again.meta["fingerprint"] == fp_now
    assert decoded(again) == path.read_text(encoding="utf-8")
    assert prepare_data(cfg, quiet=True).reused


def test_on_a_read_only_mount_a_folder_fingerprinted_the_older_way_is_used_with_a_warning(tmp_path, monkeypatch):
    cfg, path, prepared, _ = _make_old_style(tmp_path, monkeypatch)
    data_dir = tmp_path / "data"
    for lock in (data_dir / "prepared").glob("*.lock"):
        lock.unlink()
    before = snapshot(data_dir)
    args = ["-m", "data.prepare", "configs/tiny.yaml", "data.source=text", f"data.path={path}"]
    proc = run_read_only(data_dir, args, {"ATTNGPT_DATA_DIR": str(data_dir)})
    assert proc.returncode == 0 and "reused" in proc.stdout, proc.stderr[-2000:]
    assert "only the first and last MiB of each file were compared" in proc.stderr
    assert snapshot(data_dir) == before
    path.write_text(path.read_text(encoding="utf-8")[:-1] + "#", encoding="utf-8")  # now they differ there too
    proc = run_read_only(data_dir, args, {"ATTNGPT_DATA_DIR": str(data_dir)})
    assert_one_line_error(proc, "data.prepare", "the data folder is not writable")
    assert snapshot(data_dir) == before


# --- generated damage -----------------------------------------------------------------------------------------

DAMAGE = st.one_of(
    st.tuples(st.just("truncate_shard"), st.sampled_from(["train", "val"]), st.floats(0, 0.99)),
    st.tuples(st.just("append_shard"), st.sampled_from(["train", "val"]), st.binary(min_size=1, max_size=9)),
    st.tuples(st.just("flip_shard"), st.sampled_from(["train", "val"]), st.floats(0, 0.999), st.integers(0, 255)),
    st.tuples(st.just("delete_shard"), st.sampled_from(["train", "val"])),
    st.tuples(st.just("delete_meta")),
    st.tuples(st.just("garbage_meta"), st.binary(max_size=40)),
    st.tuples(st.just("cut_meta"), st.floats(0, 0.99)),
    st.tuples(st.just("meta_field"), st.sampled_from(["fingerprint", "dtype", "shards", "format_version"]),
              st.one_of(st.none(), st.integers(-3, 70000), st.text(max_size=8), st.lists(st.integers(), max_size=2),
                        st.dictionaries(st.sampled_from(["train", "val"]), st.lists(st.integers(), max_size=1)))),
    st.tuples(st.just("drop_meta_key"), st.sampled_from(["fingerprint", "dtype", "shards", "tokenizer"])),
    st.tuples(st.just("edit_corpus"), st.floats(0, 0.999), st.sampled_from("xyz.\n")),
    st.tuples(st.just("append_corpus"), st.text(alphabet="abc \n", min_size=1, max_size=20)),
)


def apply(op: tuple, folder: Path, corpus: Path) -> None:
    kind = op[0]
    meta_path = folder / META_FILE
    shard = folder / f"{op[1]}_00000.bin" if kind.endswith("_shard") else None
    if shard is not None and not shard.is_file():
        return
    if kind == "truncate_shard":
        data = shard.read_bytes()
        shard.write_bytes(data[:int(len(data) * op[2])])
    elif kind == "append_shard":
        shard.write_bytes(shard.read_bytes() + op[2])
    elif kind == "flip_shard":
        data = bytearray(shard.read_bytes())
        if data:
            data[int(len(data) * op[2])] = op[3]
        shard.write_bytes(bytes(data))
    elif kind == "delete_shard":
        shard.unlink()
    elif kind == "delete_meta":
        meta_path.unlink(missing_ok=True)
    elif kind == "garbage_meta" and meta_path.exists():
        meta_path.write_bytes(op[1])
    elif kind == "cut_meta" and meta_path.exists():
        data = meta_path.read_bytes()
        meta_path.write_bytes(data[:int(len(data) * op[1])])
    elif kind in ("meta_field", "drop_meta_key") and meta_path.exists():
        try:
            meta = json.loads(meta_path.read_text())
        except ValueError:
            return
        if not isinstance(meta, dict):
            return
        if kind == "meta_field":
            meta[op[1]] = op[2]
        else:
            meta.pop(op[1], None)
        meta_path.write_text(json.dumps(meta))
    elif kind == "edit_corpus":
        text = corpus.read_text(encoding="utf-8")
        i = int(len(text) * op[1])
        corpus.write_text(text[:i] + op[2] + text[i + 1:], encoding="utf-8")
    elif kind == "append_corpus":
        corpus.write_text(corpus.read_text(encoding="utf-8") + op[1], encoding="utf-8")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A data folder with a small text corpus prepared in it."""
    root = tmp_path_factory.mktemp("pristine")
    (root / "corpus.txt").write_text(corpus_text(30_000, seed=1), encoding="utf-8")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNGPT_DATA_DIR", str(root / "data"))
        prepare_data(text_config(root / "corpus.txt"), quiet=True)
    return root


def in_vocabulary_flips_only(ops: list[tuple], folder: Path, originals: dict[str, bytes], vocab: int) -> bool:
    """The shards differ from what was written only by bytes that still spell ids of the vocabulary, and nothing
    else was damaged: a change no check short of re-reading the corpus can see (meta.json records each shard's
    length and largest id, not a hash of it)."""
    if any(op[0] != "flip_shard" for op in ops):
        return False
    for name, data in originals.items():
        now = (folder / name).read_bytes()
        if len(now) != len(data) or int(np.frombuffer(now, dtype=np.uint16).max()) >= vocab:
            return False
    return True


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(ops=st.lists(DAMAGE, min_size=1, max_size=3))
def test_damage_to_a_prepared_folder_or_its_corpus_ends_in_the_corpus_tokens_or_one_line(pristine, tmp_path_factory,
                                                                                           ops):
    root = tmp_path_factory.mktemp("damaged")
    shutil.copytree(pristine, root, dirs_exist_ok=True)
    corpus = root / "corpus.txt"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNGPT_DATA_DIR", str(root / "data"))
        folder = next(p for p in (root / "data" / "prepared").iterdir() if p.is_dir())
        originals = {p.name: p.read_bytes() for p in folder.glob("*.bin")}
        vocab = json.loads((folder / META_FILE).read_text())["vocab_size"]
        for op in ops:
            apply(op, folder, corpus)
        outside = {p: p.read_bytes() for p in root.iterdir() if p.is_file()}
        try:
            prepared = prepare_data(text_config(corpus), quiet=True)
        except UserError as e:
            assert str(e) and "\n" not in str(e)
            return
        assert {p: p.read_bytes() for p in root.iterdir() if p.is_file()} == outside  # the corpus is only read
        text = corpus.read_text(encoding="utf-8")
        if decoded(prepared) != text:
            # only a flip to another id of the vocabulary can pass unseen, and then it is the one difference
            assert prepared.reused and in_vocabulary_flips_only(ops, folder, originals, vocab), ops
