"""pretrained/hf/export.py, writing a Hugging Face folder: check_out_dir refuses exactly what its rule says on
generated folder layouts (the layouts and their independent reading: tests/common/test_paths_write_boundaries.py),
and a conversion never replaces a folder unless forced."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.errors import UserError
from data.tokenizer import CharTokenizer
from model import GPT
from pretrained.checkpoint import save_model
from pretrained.hf.export import CONVERT_MARK, check_out_dir
from tests.common.test_paths_write_boundaries import NAMES, build, contents, expected_enclosing, layouts
from tests.hf_models import transformers_or_skip
from tests.pretrained.test_load import CHARS, GPT2_LIKE


def test_a_conversion_never_replaces_a_folder_unless_forced(tmp_path):
    transformers_or_skip()
    from pretrained.convert import to_hf
    save_model(GPT(GPT2_LIKE), tmp_path / "ckpt", extra={"tokenizer": CharTokenizer(CHARS).to_json()})
    out, _ = to_hf(str(tmp_path / "ckpt"), tmp_path / "hf")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(UserError, match="exists and is not empty"):
        to_hf(str(tmp_path / "ckpt"), out)  # force defaults to off
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=layouts, force=st.booleans(), source=st.lists(st.sampled_from(NAMES), min_size=1, max_size=3))
def test_convert_out_dir_rule_on_generated_layouts(tmp_path_factory, layout, force, source):
    """check_out_dir refuses exactly what the rule says: a source (or a folder inside or around one), anything in
    a run or model folder, a non-empty folder unless --force and convert.py's own; and refusing changes nothing."""
    root = tmp_path_factory.mktemp("layout")
    marks = build(root, layout["folders"])
    target, out = layout["target"], root.joinpath(*layout["target"])
    src = root.joinpath(*source)
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    # the layout's own account of what is there (not the file system's)
    held = contents(marks, target) if target in marks else set()
    own = CONVERT_MARK in held and not any(e.endswith("/") for e in held)
    nonempty = bool(held)
    overlap = tuple(source) in marks and (target[:len(source)] == tuple(source) or tuple(source)[:len(target)] == target)
    allowed = not overlap and expected_enclosing(marks, target, own=True) is None and (not nonempty or (force and own))
    try:
        check_out_dir(out, force, (src,) if src.exists() else ())
        refused = False
    except UserError as e:
        refused = True
        assert "\n" not in str(e) and ("OUT_DIR" in str(e) or "--force" in str(e)), str(e)
    assert refused != allowed, (layout, force, source)
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before
