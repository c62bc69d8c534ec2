"""The README and docs/ as a reader meets them: every relative link resolves (files and #anchors), and the README's
Python examples run as written on the default model."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from collections.abc import Callable
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


# --- every command the pages show: ``specdec ...`` lines parse with the real parser; scripts and modules exist ---

SHELL_BLOCK = re.compile(r"^```(?:bash|sh|shell)\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`([^`\n]+)`")
ENV = re.compile(r"^[A-Z_][A-Z0-9_]*=")
PYTHONS = ("python", "python3", "python3.11")


def shell_lines(page: Path) -> list[tuple[str, bool]]:
    """``(command line, partial)`` for each line of the page's bash blocks (continuations joined; a whole line)
    and each inline code span that starts like a command (partial: a mention in a sentence, or a synopsis)."""
    text = page.read_text(encoding="utf-8")
    found = [(line, False) for block in SHELL_BLOCK.findall(text)
             for line in block.replace("\\\n", "").splitlines() if line.strip() and not line.lstrip().startswith("#")]
    for span in INLINE.findall(FENCE.sub("", text)):
        words = span.replace("\\|", "|").split()
        while words and ENV.match(words[0]):
            words = words[1:]
        if len(words) > 1 and (words[0] in ("specdec", "bash", "pytest", *PYTHONS) or words[0].endswith("/python")
                      or words[0].endswith("bin/specdec")):
            found.append((span.replace("\\|", "|"), True))
    return found


def simple_commands(line: str) -> list[list[str]]:
    """A shell line's simple commands (split at ``&&``, ``||``, ``;``, ``|``), without leading ``VAR=value``
    assignments, ``flock FILE`` or ``time``; ``$(...)`` stands for one word."""
    words = shlex.split(re.sub(r"\$\([^)]*\)", "X", line), comments=True)
    commands, current = [], []
    for word in [*words, "&&"]:
        if word in ("&&", "||", ";", "|"):
            while current and (ENV.match(current[0]) or current[0] in ("time", "flock")):
                current = current[2:] if current[0] == "flock" else current[1:]
            if current:
                commands.append(current)
            current = []
        else:
            current.append(word)
    return commands


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next((dict(a.choices) for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})


def _parse_problem(parse: Callable[[list[str]], object], args: list[str]) -> str | None:
    """The parser's complaint about ``args`` (its last line), or None when they parse."""
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
            parse(args)
    except SystemExit as exit_:
        if exit_.code != 0:
            return errors.getvalue().strip().splitlines()[-1]
    return None


def command_problem(argv: list[str], partial: bool) -> str | None:
    """Why ``argv`` (one simple command) is wrong, or None: a ``specdec`` line must parse with the real parser
    without a former (hidden) flag, and a partial one (an inline mention, a synopsis) name real subcommands and
    options; ``bash X`` and ``python X`` must name files here, ``python -m M`` a module here."""
    program = Path(argv[0]).name
    if program == "specdec":
        from specdec.commands import build_parser

        parser = inner = build_parser()
        words = argv[1:]
        while words and words[0] in _subparsers(inner):
            inner, words = _subparsers(inner)[words[0]], words[1:]
        flags = [w.strip("[]").split("=")[0] for w in words if w.strip("[").startswith("-") and w.strip("[") != "-"]
        unknown = [f for f in flags if f not in inner._option_string_actions]
        former = [f for f in flags if f in inner._option_string_actions
                  and inner._option_string_actions[f].help == argparse.SUPPRESS]
        if unknown or former:
            return f"no option {unknown}" if unknown else f"a former flag {former}"
        return None if partial else _parse_problem(parser.parse_args, argv[1:])
    if program == "bash":
        if not (REPO / argv[1]).is_file():
            return f"no file {argv[1]}"
        if argv[1] == "scripts/vllm_check.sh" and not partial:  # its arguments go to the check's parser
            from specdec.commands.vllm_check import parse_args

            return _parse_problem(parse_args, argv[2:])
        return None
    if program in PYTHONS or program == "pytest":
        args = argv[1:] if program != "pytest" else ["-m", "pytest", *argv[1:]]
        if args[:1] == ["-m"]:
            module = args[1]
            if module == "pytest":
                paths = [a for a in args[2:] if not a.startswith("-") and ("/" in a or a.endswith(".py"))]
                missing = [a for a in paths if not (REPO / a).exists()]
                return f"no path {missing}" if missing else None
            if module.split(".")[0] not in ("specdec", "benchmarks", "scripts", "tests"):
                return None  # the standard library's (venv, ...)
            stem = REPO / module.replace(".", "/")
            exists = stem.with_suffix(".py").is_file() or (stem / "__main__.py").is_file()
            return None if exists else f"no module {module}"
        return None if (REPO / args[0]).is_file() else f"no file {args[0]}"
    return None  # pip, git, vllm, ...: not this project's to check


DOC_COMMANDS = [(page, line, partial) for page in PAGES for line, partial in shell_lines(page)]


def test_the_command_checker_finds_stale_lines(tmp_path: Path) -> None:
    page = tmp_path / "a.md"
    page.write_text("```bash\nspecdec generate \"x\" --drafter pld \\\n  --max-new-tokens 8   # fine\n"
                    "flock /tmp/l SPECDEC_X=$(mktemp -d) specdec bench oneoff --nope\nbash scripts/gone.sh\n"
                    "bash scripts/vllm_check.sh --full --repeats x\n```\n"
                    "`specdec bench replay DIR --drafters SPECS` `specdec cache info [--gone]`\n"
                    "`python -m specdec.gone`\n"
                    "`specdec generate \"x\" --backend torch` `python -m pytest benchmarks/missing.py`\n",
                    encoding="utf-8")
    problems = [command_problem(argv, partial) for line, partial in shell_lines(page)
                for argv in simple_commands(line)]
    assert problems[0] is None
    assert problems[1] == "no option ['--nope']"
    assert "--repeats: invalid int value: 'x'" in str(problems[3])
    assert problems[2:3] + problems[4:] == [
        "no file scripts/gone.sh", None, "no option ['--gone']", "no module specdec.gone",
        "a former flag ['--backend']", "no path ['benchmarks/missing.py']",
    ]


def test_every_command_in_the_docs_parses_and_names_real_files() -> None:
    problems = [f"{page.relative_to(REPO)}: {line!r}: {problem}" for page, line, partial in DOC_COMMANDS
                for argv in simple_commands(line) if (problem := command_problem(argv, partial))]
    assert problems == []


SKETCHES = {"docs/architecture.md"}  # its ``Verifier`` block is a protocol's outline (signatures, no bodies)


@pytest.mark.parametrize("page", [p for p in PAGES if str(p.relative_to(REPO)) not in SKETCHES],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_every_python_example_in_the_docs_compiles(page: Path) -> None:
    """Cheap and for every page (running them needs the default model: the README's run in the slow test above)."""
    text = page.read_text(encoding="utf-8")
    for match in re.finditer(r"^```python\n(.*?)^```", text, re.M | re.S):
        compile(match.group(1), f"{page.name} line {text[: match.start()].count(chr(10)) + 1}", "exec")
