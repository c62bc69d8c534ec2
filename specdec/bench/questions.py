"""Spec-Bench questions: loading, category grouping and stratified selection.

Spec-Bench (Xia et al., 2024, "Unlocking Efficiency in Large Language Model Inference")
ships its questions as JSON lines ``{"question_id": int, "category": str, "turns": [str, ...]}``.
Its six task categories are MT-Bench (multi-turn chat, itself split into eight fine
categories), translation, summarization, qa, math_reasoning and rag; the fine MT-Bench
categories are reported together as ``mt_bench``, as Spec-Bench's own tables do.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from specdec.errors import SpecDecError

# MT-Bench's fine categories (Zheng et al., 2023); Spec-Bench reports them as one.
MT_BENCH_CATEGORIES = frozenset(
    {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}
)
MT_BENCH = "mt_bench"
# Where the team's checkout keeps Spec-Bench, relative to the repository root.
DEFAULT_QUESTIONS = Path("..") / "shared" / "data" / "spec_bench" / "question.jsonl"


@dataclass(frozen=True)
class Question:
    """One benchmark question: ``turns`` are the user's messages, asked in order."""

    question_id: int
    category: str  # the reported category (``mt_bench`` for MT-Bench's fine categories)
    fine_category: str  # the category as the file names it
    turns: tuple[str, ...]


def report_category(category: str) -> str:
    """The category a question is reported under: MT-Bench's fine categories become ``mt_bench``."""
    return MT_BENCH if category in MT_BENCH_CATEGORIES else category


def load_questions(path: str | os.PathLike[str]) -> list[Question]:
    """Read a Spec-Bench question file; a malformed line is an error naming the file and line.

    Raises :class:`SpecDecError` when the file is missing, a line is not JSON, a field is
    missing or of the wrong type, or two questions share an id.
    """
    file = Path(path)
    if not file.is_file():
        raise SpecDecError(f"no question file at {str(path)!r} (Spec-Bench's question.jsonl)")
    questions: list[Question] = []
    seen: set[int] = set()
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{file}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise SpecDecError(f"{where} is not JSON: {error}") from None
        if not isinstance(record, dict):
            raise SpecDecError(f"{where}: expected an object, got {type(record).__name__}")
        question_id, category, turns = record.get("question_id"), record.get("category"), record.get("turns")
        if isinstance(question_id, bool) or not isinstance(question_id, int):
            raise SpecDecError(f"{where}: question_id must be an int, got {question_id!r}")
        if not isinstance(category, str) or not category:
            raise SpecDecError(f"{where}: category must be a non-empty string, got {category!r}")
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
            raise SpecDecError(f"{where}: turns must be a non-empty list of non-empty strings, got {turns!r}")
        if question_id in seen:
            raise SpecDecError(f"{where}: question_id {question_id} appears twice")
        seen.add(question_id)
        questions.append(Question(question_id, report_category(category), category, tuple(turns)))
    if not questions:
        raise SpecDecError(f"{file} holds no questions")
    return questions


def select_questions(
    questions: Sequence[Question],
    per_category: int | None = None,
    categories: Iterable[str] | None = None,
    ids: Iterable[int] | None = None,
) -> list[Question]:
    """A stratified subset: ``per_category`` questions of each category, evenly spaced.

    Taking every ``len / per_category``-th question (rather than the first ones) spreads a
    subset over the whole category, so MT-Bench's 80 questions give one or more of each of
    its eight fine categories instead of ten writing prompts. The subset is deterministic
    and keeps the file's order within the result (categories in order of first appearance).
    ``per_category=None`` keeps every question. ``ids``, when given, then keeps only the
    questions with those ids (each must be in the selection). O(len(questions)).

    >>> qs = [Question(i, "qa", "qa", ("?",)) for i in range(10)]
    >>> [q.question_id for q in select_questions(qs, 3)]
    [0, 3, 6]
    """
    if per_category is not None and (isinstance(per_category, bool) or per_category < 1):
        raise SpecDecError(f"per_category must be a positive int, got {per_category!r}")
    by_category: dict[str, list[Question]] = {}
    for question in questions:
        by_category.setdefault(question.category, []).append(question)
    if categories is not None:
        wanted = list(categories)
        unknown = [c for c in wanted if c not in by_category]
        if unknown:
            raise SpecDecError(f"unknown category {unknown[0]!r}; the file has: {', '.join(by_category)}")
        by_category = {c: by_category[c] for c in by_category if c in wanted}
    selected: list[Question] = []
    for group in by_category.values():
        if per_category is None or per_category >= len(group):
            selected.extend(group)
        else:
            selected.extend(group[(i * len(group)) // per_category] for i in range(per_category))
    if ids is not None:
        wanted_ids = set(ids)
        missing = sorted(wanted_ids - {q.question_id for q in selected})
        if missing:
            raise SpecDecError(f"question id {missing[0]} is not in the selection ({len(selected)} questions)")
        selected = [q for q in selected if q.question_id in wanted_ids]
    return selected
