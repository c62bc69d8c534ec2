"""The README and docs/ as a reader meets them: every relative link resolves (files and #anchors), and the README's
Python examples run as written on the default model."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
EXTERNAL = ("http://", "https://", "mailto:")


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``
    (a repeated heading gets ``-1``, ``-2``, ...); and the page's ``<a id="...">`` anchors."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    found = set(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", text))  # explicit anchors
    for heading in HEADING.findall(text):
        heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def links(page: Path) -> list[str]:
    """The page's link targets outside code blocks and inline code."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    text = re.sub(r"`[^`\n]*`", "", text)
    return [target for target in LINK.findall(text) if not target.startswith(EXTERNAL)]


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading with that anchor")
    return broken


def test_the_link_checker_finds_a_broken_file_and_anchor(tmp_path: Path) -> None:
    page = tmp_path / "a.md"
    (tmp_path / "b.md").write_text("# Some Title: here\n\n## Again\n## Again\n<a id=\"x-1\"></a>\n", encoding="utf-8")
    page.write_text("[ok](b.md#x-1) [ok](b.md#some-title-here) [ok](b.md#again-1) [ok](#top)\n"
                    "[no](c.md) [no](b.md#nope)\n"
                    "```\n[in code](missing.md)\n```\n`[inline](missing.md)` [web](https://example.com/x)\n\n# Top\n",
                    encoding="utf-8")
    assert broken_links(page) == ["c.md: no such file", "b.md#nope: no heading with that anchor"]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def readme_examples() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    return re.findall(r"^```python\n(.*?)^```", text, re.M | re.S)


def test_the_readme_has_the_two_examples() -> None:
    examples = readme_examples()
    assert len(examples) == 2
    assert "specdec.run(" in examples[0]
    assert "custom_generate=" in examples[1]


@pytest.mark.slow  # loads the default model
@pytest.mark.parametrize("index", range(len(readme_examples())))
def test_readme_python_example_runs(index: int) -> None:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(readme_examples()[index], f"README.md example {index + 1}", "exec"), {})
    assert printed.getvalue().strip(), "the example printed nothing"
