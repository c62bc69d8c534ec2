"""The house's marks (issue 73), measured from the tree: ``python tests/test_marks.py`` prints them all.

The tests below assert every mark: no import circle, no engine's wing of ``specdec/backends/`` importing another's,
our distribution name on every install line, ``api.py`` at
most :data:`API_LINES` lines, no class in ``specdec/`` over :data:`CLASS_LINES`, README words, docs words (in all and
per page).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from test_layers import MODULES, cycles, imports, room

ROOT = Path(__file__).resolve().parents[1]
DISTRIBUTION = "specdec-lossless"  # PyPI's "specdec" is another project
# An install line that names the bare "specdec" distribution (PyPI's other project): `pip install specdec`,
# `pip install 'specdec[bench]'`; `pip install -e .` and `specdec-lossless` are fine.
FOREIGN_INSTALL = re.compile(r"pip install\s+['\"]?specdec(?![-\w])")
README_WORDS = 1_100  # the marks on words: README.md, all of docs/ (*.md, recursively), any one page of docs/
DOCS_WORDS = 20_000
PAGE_WORDS = 5_000
API_LINES = 350  # the marks on code: specdec/api.py's lines, and any one class's in specdec/
CLASS_LINES = 300
WINGS = ("hf", "buckets", "specdec_engine", "cuda_ext")  # specdec/backends/<wing>/: one engine's (or the kernels') own


def api_lines() -> int:
    return len((ROOT / "specdec" / "api.py").read_text(encoding="utf-8").splitlines())


def largest_class() -> tuple[int, str]:
    """The longest class in ``specdec/``: its lines and ``path:name``."""
    found = (0, "")
    for path in sorted((ROOT / "specdec").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                found = max(found, (lines, f"{path.relative_to(ROOT)}:{node.name}"))
    return found


def words(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").split())


def docs_words() -> dict[str, int]:
    """Words of each page under docs/ (Markdown), by path."""
    return {str(p.relative_to(ROOT)): words(p) for p in sorted((ROOT / "docs").rglob("*.md"))}


def words_over_marks(readme: int, pages: dict[str, int]) -> list[str]:
    """What exceeds the words marks, given the README's words and each docs page's; empty when all are met."""
    over = [f"README.md: {readme} words > {README_WORDS}"] if readme > README_WORDS else []
    if sum(pages.values()) > DOCS_WORDS:
        over.append(f"docs/: {sum(pages.values())} words in {len(pages)} pages > {DOCS_WORDS}")
    return over + [f"{page}: {n} words > {PAGE_WORDS}" for page, n in pages.items() if n > PAGE_WORDS]


def circles() -> tuple[list[list[str]], list[list[str]]]:
    """Import circles of modules and of rooms in ``specdec/`` (tests/test_layers.py's reading of imports)."""
    modules = {module: {target for target, _ in imports(module)} for module in MODULES}
    rooms: dict[str, set[str]] = {}
    for module, targets in modules.items():
        rooms.setdefault(room(module), set()).update(room(t) for t in targets if room(t) != room(module))
    return cycles(modules), cycles(rooms)


def wing_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[:2] == ["specdec", "backends"] and parts[2] in WINGS else None


def wing_crossings(graph: dict[str, set[str]] | None = None) -> list[str]:
    """Imports from one wing of ``specdec/backends/`` into another (``graph``: module -> modules it imports;
    default: the tree's); empty when each wing uses only the shared hall and itself."""
    if graph is None:
        graph = {module: {target for target, _ in imports(module)} for module in MODULES}
    return sorted(f"{module} -> {target}" for module, targets in graph.items() for target in targets
                  if wing_of(module) and wing_of(target) and wing_of(module) != wing_of(target))  # fmt: skip


def distribution_name() -> str:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    found = re.search(r'^\[project\]\s*\nname\s*=\s*"([^"]+)"', text, re.M)
    assert found, "pyproject.toml names no [project] distribution"
    return found.group(1)


def foreign_install_lines() -> list[str]:
    """Lines of the README, docs and library that tell users to install PyPI's other ``specdec``."""
    places = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "specdec").rglob("*.py"),
              *(ROOT / "scripts").glob("*")]  # fmt: skip
    return [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in places if p.is_file()
            for n, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
            if FOREIGN_INSTALL.search(line)]


def test_no_import_circle() -> None:
    modules, rooms = circles()
    assert modules == [] and rooms == []


def test_no_wing_imports_another() -> None:
    assert wing_crossings() == []
    made_up = {"specdec.backends.hf.forward": {"specdec.backends.buckets.rows", "specdec.backends.verifier"},
               "specdec.backends.buckets.rows": {"specdec.backends.buckets.forward"}}  # fmt: skip
    assert wing_crossings(made_up) == ["specdec.backends.hf.forward -> specdec.backends.buckets.rows"]


def test_the_distribution_is_ours_and_every_install_line_names_it() -> None:
    assert distribution_name() == DISTRIBUTION
    assert foreign_install_lines() == []
    assert FOREIGN_INSTALL.search("pip install 'specdec[bench]'") and FOREIGN_INSTALL.search("pip install specdec")
    assert not FOREIGN_INSTALL.search("pip install 'specdec-lossless[bench]'")


def test_api_and_every_class_are_within_their_lines_marks() -> None:
    assert api_lines() <= API_LINES, f"specdec/api.py: {api_lines()} lines > {API_LINES}"
    lines, where = largest_class()
    assert lines <= CLASS_LINES, f"{where}: {lines} lines > {CLASS_LINES}"


def test_the_readme_and_docs_are_within_their_words_marks() -> None:
    assert words_over_marks(words(ROOT / "README.md"), docs_words()) == []


def test_the_words_marks_fail_one_word_past_each_bound() -> None:
    at_marks = {f"docs/{name}.md": PAGE_WORDS for name in "abcd"}  # 4 pages of 5,000: 20,000 in all
    assert words_over_marks(README_WORDS, at_marks) == []
    assert words_over_marks(README_WORDS + 1, {**at_marks, "docs/a.md": PAGE_WORDS + 1}) == [
        f"README.md: {README_WORDS + 1} words > {README_WORDS}",
        f"docs/: {DOCS_WORDS + 1} words in 4 pages > {DOCS_WORDS}",
        f"docs/a.md: {PAGE_WORDS + 1} words > {PAGE_WORDS}",
    ]


def test_the_measures_read_the_tree() -> None:
    """The marks measure something: the files are there and the counts are not empty."""
    assert api_lines() > 100 and largest_class()[0] > 50 and words(ROOT / "README.md") > 500
    assert len(docs_words()) > 5 and sum(docs_words().values()) > 10_000


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    pages = docs_words()
    longest = max(pages.items(), key=lambda item: item[1])
    modules, rooms = circles()
    print(f"api.py lines: {api_lines()} (mark {API_LINES})")
    print(f"largest class: {largest_class()[0]} lines, {largest_class()[1]} (mark {CLASS_LINES})")
    print(f"README words: {words(ROOT / 'README.md')} (mark {README_WORDS})")
    over = sum(1 for n in pages.values() if n > PAGE_WORDS)
    print(f"docs words: {sum(pages.values())} in {len(pages)} pages (mark {DOCS_WORDS}); longest {longest[0]}"
          f" {longest[1]} (mark {PAGE_WORDS}); pages over {PAGE_WORDS}: {over}")
    print(f"import circles: modules {modules}, rooms {rooms}")
    print(f"imports across the wings of specdec/backends/ ({', '.join(WINGS)}): {wing_crossings()}")
    print(f"distribution: {distribution_name()}; install lines naming PyPI's other specdec: {foreign_install_lines()}")
