"""The documentation holds together: every relative link in README.md, docs/*.md and benchmarks/*.md points at
a file that exists and, where it names an anchor, at a heading (or an HTML id) of that file as GitHub renders
it; the README stays a short front door whose test command is the one `.ci/run` runs.

No network: links with a scheme (https:, mailto:) are not followed. Links inside fenced code blocks and code
spans are text, not links, and are skipped, as GitHub does.
"""
from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from urllib.parse import unquote

REPO = Path(__file__).resolve().parents[2]
README_MAX_LINES = 200

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ID = re.compile(r"<[a-zA-Z][^>]*\s(?:id|name)=\"([^\"]+)\"")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^//")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line outside fenced code blocks, code spans blanked out."""
    lines, in_fence = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            lines.append((number, CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)))
    return lines


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its rendered text lower-cased, every character that is not a
    letter, digit, mark, space, '-' or '_' dropped, spaces turned into '-' (one each, never merged)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading renders as its text
    text = re.sub(r"<[^>]+>", "", text).lower()
    kept = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in "LNM")
    return kept.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a markdown file offers: its headings' slugs (a repeated slug gets -1, -2, ... as on
    GitHub) and the id/name attributes of its HTML tags."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in prose_lines(text):
        found.update(HTML_ID.findall(line))
        match = HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every inline link, image and reference definition."""
    found = []
    for number, line in prose_lines(text):
        found += [(number, target) for target in INLINE_LINK.findall(line)]
        definition = REFERENCE_DEF.match(line)
        if definition:
            found.append((number, definition.group(1)))
    return found


def broken_links(path: Path) -> list[str]:
    """'file:line: target (why)' for every relative link of `path` that does not resolve."""
    text = path.read_text(encoding="utf-8")
    problems = []
    for number, target in links(text):
        if SCHEME.match(target):
            continue  # the web: not followed here
        file_part, _, anchor = target.partition("#")
        destination = (path.parent / unquote(file_part)).resolve() if file_part else path
        where = f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{number}: {target}"
        if not destination.exists():
            problems.append(f"{where} (no such file)")
        elif anchor and destination.suffix == ".md":
            if unquote(anchor) not in anchors(destination.read_text(encoding="utf-8")):
                problems.append(f"{where} (no heading or id '{anchor}' in {destination.name})")
    return problems


def documentation() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "benchmarks").glob("*.md"))]


def test_every_relative_link_in_the_documentation_resolves() -> None:
    problems = [problem for page in documentation() for problem in broken_links(page)]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_every_docs_page_is_reachable_from_the_readme() -> None:
    readme_targets = {target.partition("#")[0] for _, target in links((REPO / "README.md").read_text(encoding="utf-8"))}
    pages = {f"docs/{page.name}" for page in (REPO / "docs").glob("*.md")}
    assert not pages - readme_targets, f"docs pages the README does not link: {sorted(pages - readme_targets)}"


def test_the_readme_is_a_short_front_door_with_the_ci_test_command() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= README_MAX_LINES
    ci_lines = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    command = ci_lines[ci_lines.index("# The README's test command, verbatim:") + 1]
    assert f"```bash\n{command}\n```" in readme


def test_the_checker_finds_missing_files_and_anchors(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(
        "# Page\n\n## Weights & Biases\n\n## Repeated\n\n## Repeated\n\n<a id=\"custom\"></a>\n"
        "```bash\n# not a heading\n```\n", encoding="utf-8")
    (tmp_path / "README.md").write_text(
        "[ok](docs/page.md) [ok](docs/page.md#weights--biases) [ok](docs/page.md#repeated-1)\n"
        "[ok](docs/page.md#custom) [ok](#top) [web](https://example.com/missing.md) `[code](docs/none.md)`\n"
        "# Top\n"
        "[bad](docs/none.md) ![bad](docs/none.png) [bad](docs/page.md#repeated-2) [bad](docs/page.md#not-a-heading)\n"
        "```\n[fenced](docs/none.md)\n```\n"
        "[ref]: docs/missing.md\n", encoding="utf-8")
    problems = broken_links(tmp_path / "README.md")
    assert [p.split(": ", 1)[1] for p in problems] == [
        "docs/none.md (no such file)",
        "docs/none.png (no such file)",
        "docs/page.md#repeated-2 (no heading or id 'repeated-2' in page.md)",
        "docs/page.md#not-a-heading (no heading or id 'not-a-heading' in page.md)",
        "docs/missing.md (no such file)",
    ]


def test_slugs_are_the_anchors_github_renders() -> None:
    assert slug("Val loss vs wall-clock, configs/small.yaml (2026-11-30 09:23)") == (
        "val-loss-vs-wall-clock-configssmallyaml-2026-11-30-0923")
    assert slug("GPT-2's attention") == "gpt-2s-attention"
    assert slug("Weights & Biases") == "weights--biases"
    assert slug("`dtype` and `n_kv_head`") == "dtype-and-n_kv_head"
    assert slug("Precision — measured, [not](x.md) assumed") == "precision--measured-not-assumed"
