"""The house's marks (issue 73), measured from the tree: ``python tests/test_marks.py`` prints them all.

The tests below assert the marks that are met; the others (``api.py`` lines, the largest class,
README and docs words) are printed by the script and not asserted until they are met.
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


def circles() -> tuple[list[list[str]], list[list[str]]]:
    """Import circles of modules and of rooms in ``specdec/`` (tests/test_layers.py's reading of imports)."""
    modules = {module: {target for target, _ in imports(module)} for module in MODULES}
    rooms: dict[str, set[str]] = {}
    for module, targets in modules.items():
        rooms.setdefault(room(module), set()).update(room(t) for t in targets if room(t) != room(module))
    return cycles(modules), cycles(rooms)


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


def test_the_distribution_is_ours_and_every_install_line_names_it() -> None:
    assert distribution_name() == DISTRIBUTION
    assert foreign_install_lines() == []
    assert FOREIGN_INSTALL.search("pip install 'specdec[bench]'") and FOREIGN_INSTALL.search("pip install specdec")
    assert not FOREIGN_INSTALL.search("pip install 'specdec-lossless[bench]'")


def test_the_measures_read_the_tree() -> None:
    """The printed marks measure something: the files are there and the counts are not empty."""
    assert api_lines() > 100 and largest_class()[0] > 50 and words(ROOT / "README.md") > 500
    assert len(docs_words()) > 5 and sum(docs_words().values()) > 10_000


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    pages = docs_words()
    longest = max(pages.items(), key=lambda item: item[1])
    modules, rooms = circles()
    print(f"api.py lines: {api_lines()} (mark 350)")
    print(f"largest class: {largest_class()[0]} lines, {largest_class()[1]} (mark 300)")
    print(f"README words: {words(ROOT / 'README.md')} (mark 1100)")
    print(f"docs words: {sum(pages.values())} in {len(pages)} pages (mark 20000); longest {longest[0]} {longest[1]}"
          f" (mark 5000); pages over 5000: {sum(1 for n in pages.values() if n > 5000)}")
    print(f"import circles: modules {modules}, rooms {rooms}")
    print(f"distribution: {distribution_name()}; install lines naming PyPI's other specdec: {foreign_install_lines()}")
