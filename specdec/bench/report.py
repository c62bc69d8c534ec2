"""Tables from saved benchmark runs: one run's summary, or two runs side by side.

The figures, per category and overall, follow Spec-Bench's definitions:

- **MAT** (mean accepted tokens): tokens emitted by target forwards after the prefill,
  divided by those forwards, summed over the category's questions (so long answers weigh
  by their steps, as in Spec-Bench's mean over steps). 1.0 for plain decoding.
- **tokens/s**: the mean over questions of each question's new tokens / wall time.
- **speedup**: a method's mean tokens/s divided by the baseline's (the run's first
  method) over the same questions.
- **identical**: outputs token-identical to their reference (:mod:`specdec.bench.judge`);
  **near-tie**: greedy outputs whose first difference sits where the model's top two
  logits are within :data:`specdec.testing.NEAR_TIE_MARGIN`; **near-boundary**: sampled
  outputs whose first difference sits where the uniform draw lay within rounding of a
  bucket boundary under both runs' forwards (rounding, not a bug); the rest are real
  differences.
- **host ms/forward**: wall time outside the model's forwards per forward (the loop,
  drafting, masks, acceptance, cache bookkeeping); for specdec methods also the loop's
  own time (``other_s``) and drafting (``draft_s``) per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specdec.errors import SpecDecError

OVERALL = "overall"


def _cell(runs: Sequence[dict[str, Any]], baseline_runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Aggregate one method's per-question records over a set of questions."""
    n = len(runs)
    steps = sum(r["steps"] for r in runs)
    emitted = sum(r["emitted_by_steps"] for r in runs)
    forwards = sum(r["forwards"] for r in runs)
    wall = sum(r["wall_s"] for r in runs)
    tokens_per_s = sum(r["tokens_per_s"] for r in runs) / n
    baseline_tps = sum(r["tokens_per_s"] for r in baseline_runs) / n
    identical = sum(1 for r in runs if r["identical"])
    near_tie = sum(1 for r in runs if r["near_tie"])
    near_boundary = sum(1 for r in runs if r.get("near_boundary"))  # absent from specdec-bench/1 files

    def per(name: str, denominator: int) -> float | None:
        values = [r.get(name) for r in runs]
        if denominator == 0 or any(v is None for v in values):
            return None
        return round(1000 * sum(float(v) for v in values if v is not None) / denominator, 3)

    forward_s = [r.get("forward_s") for r in runs]
    host_ms = None
    if forwards and all(v is not None for v in forward_s):
        host_ms = round(1000 * (wall - sum(v for v in forward_s if v is not None)) / forwards, 3)
    return {
        "questions": n,
        "new_tokens": sum(r["new_tokens"] for r in runs),
        "steps": steps,
        "mat": round(emitted / steps, 4) if steps else None,
        "tokens_per_s": round(tokens_per_s, 4),
        "speedup": round(tokens_per_s / baseline_tps, 4) if baseline_tps > 0 else None,
        "identical": identical,
        "near_tie": near_tie,
        "near_boundary": near_boundary,
        "different": n - identical - near_tie - near_boundary,
        "forward_ms": per("forward_s", forwards),
        "host_ms_per_forward": host_ms,
        "verify_ms_per_step": per("verify_s", steps),
        "draft_ms_per_step": per("draft_s", steps),
        "other_ms_per_step": per("other_s", steps),
    }


def summarize(results: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """``summary[category][label]`` for every category (in order of appearance) and ``overall``."""
    labels = [m["label"] for m in results["methods"]]
    baseline = results["baseline"]
    groups: dict[str, list[dict[str, Any]]] = {}
    for question in results["questions"]:
        groups.setdefault(question["category"], []).append(question)
    if results["questions"]:
        groups[OVERALL] = list(results["questions"])
    summary: dict[str, dict[str, dict[str, Any]]] = {}
    for category, questions in groups.items():
        baseline_runs = [q["runs"][baseline] for q in questions]
        summary[category] = {label: _cell([q["runs"][label] for q in questions], baseline_runs) for label in labels}
    return summary


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured markdown table (readable as plain text too)."""
    cells = [[str(c) for c in header], *[["-" if c is None else str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(cells[0], widths, strict=True)) + " |",
             "| " + " | ".join("-" * w for w in widths) + " |"]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |" for row in cells[1:]]
    return "\n".join(lines)


def _fmt(value: float | None, digits: int = 2, suffix: str = "") -> str | None:
    return None if value is None else f"{value:.{digits}f}{suffix}"


def format_report(results: dict[str, Any]) -> str:
    """The run's tables: speedup, MAT and tokens/s per category, then per-method totals."""
    summary = summarize(results)
    if not summary:
        return "no questions measured yet"
    labels = [m["label"] for m in results["methods"]]
    categories = list(summary)
    meta = results["meta"]
    settings = meta["settings"]
    counts = {c: summary[c][labels[0]]["questions"] for c in categories}
    header = ["method", *[f"{c} ({counts[c]})" for c in categories]]
    parts = [
        f"model {meta['model']['name']} ({meta['model']['dtype']}, {meta['model']['device']}), "
        f"{settings['max_new_tokens']} new tokens, {settings['turns']} turn(s), {counts[OVERALL]} questions; "
        f"baseline {results['baseline']}, identity vs {results['reference']}",
        "",
        "Speedup (mean tokens/s over the baseline's)",
        markdown_table(header, [[lb, *[_fmt(summary[c][lb]["speedup"], 2, "x") for c in categories]]
                                for lb in labels]),
        "",
        "MAT (tokens per target forward)",
        markdown_table(header, [[lb, *[_fmt(summary[c][lb]["mat"]) for c in categories]] for lb in labels]),
        "",
        "Tokens/s (mean over questions)",
        markdown_table(header, [[lb, *[_fmt(summary[c][lb]["tokens_per_s"]) for c in categories]]
                                for lb in labels]),
        "",
        "Overall",
    ]
    rows = []
    for label in labels:
        cell = summary[OVERALL][label]
        rows.append([
            label, _fmt(cell["mat"]), _fmt(cell["tokens_per_s"]), _fmt(cell["speedup"], 2, "x"),
            f"{cell['identical']}/{cell['questions']}", cell["near_tie"], cell["near_boundary"], cell["different"],
            _fmt(cell["forward_ms"], 1), _fmt(cell["host_ms_per_forward"], 2), _fmt(cell["verify_ms_per_step"], 1),
            _fmt(cell["draft_ms_per_step"], 3), _fmt(cell["other_ms_per_step"], 3),
        ])
    parts.append(markdown_table(
        ["method", "MAT", "tokens/s", "speedup", "identical", "near-tie", "near-boundary", "different",
         "forward ms", "host ms/forward", "verify ms/step", "draft ms/step", "loop ms/step"],
        rows,
    ))
    sources = sources_table(results)
    if sources:
        parts += ["", "Drafter sources (steps served, accepted tokens drafted), all questions", sources]
    differences = differences_table(results)
    if differences:
        parts += ["", "Differences from the reference (the judge's verdict at the first differing token)", differences]
    warmup = meta.get("warmup") or {}
    if warmup:
        calls = max(map(len, warmup.values()))  # specdec's methods have a prepare call first, peers do not
        parts += ["", "Warm-up (untimed): seconds of each call; specdec's methods first prepare (calibration, and "
                  "on a static cache compiling every bucket), then generate "
                  f"{settings.get('warmup_tokens', '?')} new tokens twice (a compiled peer compiles in its first)",
                  markdown_table(["method", *[f"call {i + 1}" for i in range(calls)]],
                                 [[label, *[_fmt(s, 2) for s in seconds], *["-"] * (calls - len(seconds))]
                                  for label, seconds in warmup.items()])]
    return "\n".join(parts)


def sources_table(results: dict[str, Any]) -> str:
    """Per specdec method with more than one drafter source: steps and accepted tokens by source."""
    rows = []
    for method in results["methods"]:
        label = method["label"]
        totals: dict[str, dict[str, int]] = {"steps": {}, "accepted": {}}
        for question in results["questions"]:
            for kind, counts in (question["runs"][label].get("sources") or {}).items():
                for source, count in counts.items():
                    totals[kind][source] = totals[kind].get(source, 0) + count
        if len(totals["steps"]) > 1 or len(totals["accepted"]) > 1:
            rows.append([label, ", ".join(f"{s} {n}" for s, n in sorted(totals["steps"].items())),
                         ", ".join(f"{s} {n}" for s, n in sorted(totals["accepted"].items()))])
    return markdown_table(["method", "steps by source", "accepted tokens by source"], rows) if rows else ""


def differences_table(results: dict[str, Any]) -> str:
    """One row per output that is not identical to its reference: where, and what the judge found."""
    rows = []
    for question in results["questions"]:
        for label, record in question["runs"].items():
            if record["identical"]:
                continue
            boundary = record.get("boundary")
            if boundary:
                finding = ("no verdict (a redo did not reproduce the run)" if boundary["distance"] is None else
                           f"draw {boundary['distance']:.2e} from a bucket boundary (limit {boundary['limit']:.1e})")
                kind = "near-boundary" if record.get("near_boundary") else "different"
            elif record.get("finding"):  # the judge's own account (tokens, top two, margin, the branches)
                finding = record["finding"]
                kind = "near-tie" if record["near_tie"] else "different"
            elif record.get("margin") is not None:  # a run saved before the judge wrote its finding
                finding = f"top-two logit margin {record['margin']:.2e}"
                kind = "near-tie" if record["near_tie"] else "different"
            else:
                finding, kind = "one output is a prefix of the other (a stop rule)", "different"
            rows.append([question["question_id"], question["category"], label, record.get("difference_turn"),
                         record.get("first_difference"), finding, kind])
    if not rows:
        return ""
    return markdown_table(["question", "category", "method", "turn", "index", "finding", "verdict"], rows)


def _common(first: dict[str, Any], second: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], list[str],
                                                                     dict[str, int]]:
    """Both runs cut to the questions they share, the method labels they share, and per label the
    number of outputs that changed (by fingerprint) from the first run to the second."""
    common_ids = {q["question_id"] for q in first["questions"]} & {q["question_id"] for q in second["questions"]}
    if not common_ids:
        raise SpecDecError("the two runs share no questions")
    labels = [m["label"] for m in first["methods"] if m["label"] in {n["label"] for n in second["methods"]}]
    if not labels:
        raise SpecDecError("the two runs share no method labels")

    def restricted(results: dict[str, Any]) -> dict[str, Any]:
        return {**results, "questions": [q for q in results["questions"] if q["question_id"] in common_ids]}

    a, b = restricted(first), restricted(second)
    changed = {label: 0 for label in labels}
    by_id = {q["question_id"]: q for q in b["questions"]}
    for question in a["questions"]:
        other = by_id[question["question_id"]]
        for label in labels:
            if question["runs"][label]["output_sha1"] != other["runs"][label]["output_sha1"]:
                changed[label] += 1
    return a, b, labels, changed


def regressions(saved: dict[str, Any], new: dict[str, Any], tolerance: float = 0.03) -> list[str]:
    """What got worse from ``saved`` to ``new`` on their shared questions (empty: nothing).

    Deterministic figures only: a method's overall MAT fell by more than ``tolerance``
    (relative), or it has outputs that are neither identical to their reference nor
    explained by the judge (near-tie, near-boundary) where the saved run had fewer.
    Wall times are not checked: they move with the machine.
    """
    a, b, labels, _ = _common(saved, new)
    before, after = summarize(a)[OVERALL], summarize(b)[OVERALL]
    problems = []
    for label in labels:
        was, now = before[label], after[label]
        if was["mat"] is not None and now["mat"] is not None and now["mat"] < was["mat"] * (1 - tolerance):
            problems.append(f"{label}: MAT {now['mat']:.3f}, saved {was['mat']:.3f} (tolerance {tolerance:.0%})")
        if now["different"] > was["different"]:
            problems.append(f"{label}: {now['different']} outputs differ from the reference beyond the judge's "
                            f"near-tie/near-boundary verdicts, saved {was['different']}")
    return problems


def format_comparison(first: dict[str, Any], second: dict[str, Any]) -> str:
    """Two runs side by side: MAT, tokens/s and speedup per method and category, with changes.

    Methods are matched by label and questions by id; only questions both runs measured
    count, so a partial run compares fairly with a full one. Outputs that changed between
    the runs (by fingerprint) are counted too: a change there in a lossless method means the
    baseline itself changed (another model, another library version) or a bug.
    """
    a, b, labels, changed = _common(first, second)
    summary_a, summary_b = summarize(a), summarize(b)
    common_ids = {q["question_id"] for q in a["questions"]}

    def change(x: float | None, y: float | None) -> str | None:
        return None if x is None or y is None or x == 0 else f"{100 * (y - x) / x:+.1f}%"

    rows = []
    for category in summary_a:
        for label in labels:
            ca, cb = summary_a[category][label], summary_b[category][label]
            rows.append([
                category, label, _fmt(ca["mat"]), _fmt(cb["mat"]), change(ca["mat"], cb["mat"]),
                _fmt(ca["tokens_per_s"]), _fmt(cb["tokens_per_s"]), change(ca["tokens_per_s"], cb["tokens_per_s"]),
                _fmt(ca["speedup"], 2, "x"), _fmt(cb["speedup"], 2, "x"),
            ])
    header = ["category", "method", "MAT A", "MAT B", "MAT change", "tok/s A", "tok/s B", "tok/s change",
              "speedup A", "speedup B"]
    lines = [
        f"A: {first['meta']['command'] or '?'} ({first['meta']['started']}, {first['meta']['machine']['cpu']})",
        f"B: {second['meta']['command'] or '?'} ({second['meta']['started']}, {second['meta']['machine']['cpu']})",
        f"{len(common_ids)} questions in common; outputs changed from A to B: "
        + ", ".join(f"{label} {changed[label]}" for label in labels),
        "",
        markdown_table(header, rows),
    ]
    return "\n".join(lines)
