"""The Spec-Bench runner: every method on every question, interleaved, saved as it goes.

For each question, every method generates its answer in turn (the order rotates from one
question to the next), so slow drift of a shared machine (other jobs, thermal state)
hits all methods alike instead of whichever ran last. Each method is warmed up once on a
short generation before any timed run: first calls pay one-time costs (allocator growth,
lazy imports, kernel selection) that are not decoding speed.

Per question and method the runner records new tokens, wall time, target forwards
(steps), MAT, tokens/s, the time inside the model's forwards and outside them, specdec's
draft/verify/other split, and the judge's verdict (:mod:`specdec.bench.judge`): whether
the output is token-identical to its reference (the first greedy baseline, ``none`` or
``hf-generate``; for a sampled method, ``none`` sampling with the same options), or differs
first on a greedy near-tie or a near-boundary sampling draw. ``results.json``
(:mod:`specdec.bench.results`) is rewritten after every question (atomically), so an
interrupted run keeps what it measured and ``resume=True`` continues it.

With ``turns=2``, questions that have a second turn (MT-Bench's) ask it after each method's
own first answer, as Spec-Bench does; the figures of both turns add up per question.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from specdec.bench.judge import Judge
from specdec.bench.methods import ForwardMeter, Measurement, Method, MethodSpec, build_methods
from specdec.bench.questions import Question
from specdec.bench.report import summarize
from specdec.bench.results import (
    RESULTS_FILE,
    RESULTS_FORMAT,
    file_digest,
    load_results,
    machine_info,
    model_info,
    now,
    output_digest,
    software_versions,
    write_json_atomic,
)
from specdec.errors import SpecDecError
from specdec.models import encode_prompt


@dataclass(frozen=True)
class BenchSettings:
    """What makes two runs comparable; a resumed run must match the saved one exactly."""

    model: str
    max_new_tokens: int = 128
    turns: int = 1
    tree_ops: str = "auto"
    datastores: tuple[str, ...] = ()
    warmup_tokens: int = 16
    keep_outputs: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.max_new_tokens, bool) or self.max_new_tokens < 1:
            raise SpecDecError(f"max_new_tokens must be a positive int, got {self.max_new_tokens!r}")
        if self.turns not in (1, 2):
            raise SpecDecError(f"turns must be 1 or 2, got {self.turns!r}")
        if self.warmup_tokens < 1:
            raise SpecDecError(f"warmup_tokens must be a positive int, got {self.warmup_tokens!r}")

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model, "max_new_tokens": self.max_new_tokens, "turns": self.turns,
            "tree_ops": self.tree_ops, "datastores": list(self.datastores), "warmup_tokens": self.warmup_tokens,
            "keep_outputs": self.keep_outputs,
        }


def _turn_prompt(tokenizer: Any, question: Question, answers: Sequence[str]) -> list[int]:
    """The chat for the next turn: every earlier turn with this method's own answer to it."""
    if not answers:
        return encode_prompt(tokenizer, question.turns[0])
    messages: list[dict[str, str]] = []
    for turn, answer in zip(question.turns, answers, strict=False):
        messages += [{"role": "user", "content": turn}, {"role": "assistant", "content": answer}]
    messages.append({"role": "user", "content": question.turns[len(answers)]})
    return encode_prompt(tokenizer, messages)


def warm_up(methods: Sequence[Method], tokenizer: Any, question: Question, tokens: int,
            max_tokens: int | None = None) -> dict[str, list[float]]:
    """Two short generations per method, untimed: first calls pay one-time costs.

    Before them, a method's ``prepare(max_tokens)`` (where it has one) pays what it can up
    front: the budget planner's calibration, and on a static cache the compiled or captured
    forward of every bucket for sequences of up to ``max_tokens`` tokens (the longest
    question of the run), so no timed question regrows the cache and recompiles. Its
    seconds come first in the method's list.

    The second prompt repeats the first one's ending, so that drafters find something to
    draft and anything done on a first draft (the budget planner's calibration) happens
    here; it is also longer, so a compiled peer meets a second shape (and recompiles, if it
    does) here. Returns each call's seconds per method (a compiled peer's first call is its
    compile time).
    """
    prompt = _turn_prompt(tokenizer, question, [])
    tail = prompt[-256:]
    seconds: dict[str, list[float]] = {}
    for method in methods:
        prepare = getattr(method, "prepare", None)
        seconds[method.spec.label] = []
        if prepare is not None:
            started = time.perf_counter()
            prepare(max_tokens)
            seconds[method.spec.label].append(round(time.perf_counter() - started, 3))
        for warm in (prompt, [*prompt, *tail, *tail]):
            started = time.perf_counter()
            method.generate(warm, tokens)
            seconds[method.spec.label].append(round(time.perf_counter() - started, 3))
        after = getattr(method, "after_warmup", None)
        if after is not None:
            after()
    return seconds


def _record(measurements: list[Measurement], prompts: list[list[int]]) -> dict[str, Any]:
    """One question's figures for one method, summed over its turns."""
    def total(name: str) -> float | None:
        values = [getattr(m, name) for m in measurements]
        return None if any(v is None for v in values) else round(float(sum(values)), 6)

    new_tokens = sum(m.new_tokens for m in measurements)
    steps = sum(m.steps for m in measurements)
    emitted = sum(m.emitted_by_steps for m in measurements)
    wall_s = sum(m.wall_s for m in measurements)
    return {
        "prompt_tokens": [len(p) for p in prompts],
        "new_tokens": new_tokens,
        "wall_s": round(wall_s, 6),
        "tokens_per_s": round(new_tokens / wall_s, 4) if wall_s > 0 else 0.0,
        "forwards": sum(m.forwards for m in measurements),
        "steps": steps,
        "emitted_by_steps": emitted,
        "mat": round(emitted / steps, 4) if steps else None,
        "forward_s": total("forward_s"),
        "calibration_s": total("calibration_s"),
        "extra_forwards": sum(m.extra_forwards for m in measurements),
        "prefill_s": total("prefill_s"),
        "draft_s": total("draft_s"),
        "verify_s": total("verify_s"),
        "other_s": total("other_s"),
        "mean_tree_size": _ratio(total("tree_nodes"), max(steps, 1)),
        "sources": _sources(measurements),
        "stop_reason": [m.stop_reason for m in measurements],
        "output_sha1": [output_digest(m.tokens) for m in measurements],
    }


def _sources(measurements: list[Measurement]) -> dict[str, dict[str, int]] | None:
    """Steps and accepted tokens per drafter source, summed over the turns (None for the peers)."""
    if any(m.sources is None for m in measurements):
        return None
    summed: dict[str, dict[str, int]] = {"steps": {}, "accepted": {}}
    for measurement in measurements:
        for kind, counts in (measurement.sources or {}).items():
            for source, count in counts.items():
                summed[kind][source] = summed[kind].get(source, 0) + count
    return summed


def _ratio(numerator: float | None, denominator: int) -> float | None:
    return None if numerator is None else round(numerator / denominator, 3)


class BenchRun:
    """A benchmark run in ``out_dir``: methods built once, questions measured one by one.

    ``model`` and ``tokenizer`` are loaded by the caller (once per run); ``specs`` name the
    methods, the first being the speedup baseline. ``command`` is what reproduces the run.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        specs: Sequence[MethodSpec],
        settings: BenchSettings,
        out_dir: str | os.PathLike[str],
        *,
        questions_file: str | os.PathLike[str] | None = None,
        command: str = "",
        resume: bool = False,
    ) -> None:
        if tokenizer is None:
            raise SpecDecError("the benchmark needs a tokenizer to turn questions into prompts")
        self.model, self.tokenizer, self.settings = model, tokenizer, settings
        self.specs = list(specs)
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / RESULTS_FILE
        self._references = references(self.specs)
        self.meter = ForwardMeter(model)
        self.methods: list[Method] = build_methods(
            self.specs, model, tokenizer, self.meter, tree_ops=settings.tree_ops, datastores=settings.datastores
        )
        self._by_label = {method.spec.label: method for method in self.methods}
        self.judge = Judge(model, settings.max_new_tokens)
        reference = next((s for s in self.specs if s.is_greedy_baseline), self.specs[0])
        self.results: dict[str, Any] = {
            "format": RESULTS_FORMAT,
            "meta": {
                "command": command,
                "argv": sys.argv,
                "started": now(),
                "finished": None,
                "machine": machine_info(),
                "versions": software_versions(),
                "model": model_info(model, settings.model),
                "settings": settings.to_json(),
                "questions_file": None if questions_file is None else str(questions_file),
                "questions_sha256": None if questions_file is None else file_digest(questions_file),
                "warmup": {},
            },
            "methods": [s.to_json() for s in self.specs],
            "baseline": self.specs[0].label,
            "reference": reference.label,
            "references": dict(self._references),
            "questions": [],
        }
        if self.path.exists():
            if not resume:
                raise SpecDecError(f"{self.path} exists: pass --resume to continue that run, or choose another --out")
            self._load_for_resume()

    def _load_for_resume(self) -> None:
        saved = load_results(self.path)
        if saved.get("format") != RESULTS_FORMAT:
            raise SpecDecError(f"cannot resume {self.path}: it is {saved.get('format')!r}, this run {RESULTS_FORMAT}")
        mismatch = [
            name for name, ours, theirs in (
                ("settings", self.results["meta"]["settings"], saved["meta"].get("settings")),
                ("methods", self.results["methods"], saved.get("methods")),
                ("questions file", self.results["meta"]["questions_sha256"], saved["meta"].get("questions_sha256")),
            ) if ours != theirs
        ]
        if mismatch:
            raise SpecDecError(f"cannot resume {self.path}: its {mismatch[0]} differ from this run's")
        saved["meta"].setdefault("resumed", []).append({"at": now(), "machine": self.results["meta"]["machine"]})
        saved["meta"]["finished"] = None
        self.results = saved

    @property
    def done(self) -> set[int]:
        return {q["question_id"] for q in self.results["questions"]}

    def warm_up(self, question: Question, questions: Sequence[Question] = ()) -> None:
        """Warm every method up on ``question``, for sequences as long as the longest of ``questions`` can get."""
        longest = max((len(_turn_prompt(self.tokenizer, q, [])) for q in (question, *questions)), default=0)
        # A second turn's prompt holds the first turn's prompt and answer: bound it by twice the first turn.
        max_tokens = self.settings.turns * (longest + self.settings.max_new_tokens)
        self.results["meta"]["warmup"] = warm_up(self.methods, self.tokenizer, question, self.settings.warmup_tokens,
                                                 max_tokens)

    def measure(self, question: Question, index: int, tick: Callable[[str], None] | None = None) -> dict[str, Any]:
        """Every method on ``question`` (order rotated by ``index``), judged and recorded."""
        count = len(self.methods)
        order = [self.methods[(index + k) % count] for k in range(count)]
        turns = question.turns[: self.settings.turns]
        outputs: dict[str, list[Measurement]] = {}
        prompts: dict[str, list[list[int]]] = {}
        for method in order:
            label = method.spec.label
            outputs[label], prompts[label] = [], []
            answers: list[str] = []
            for _ in turns:
                prompt = _turn_prompt(self.tokenizer, question, answers)
                measurement = method.generate(prompt, self.settings.max_new_tokens)
                outputs[label].append(measurement)
                prompts[label].append(prompt)
                answers.append(str(self.tokenizer.decode(measurement.tokens, skip_special_tokens=True)))
            if tick is not None:
                tick(label)
        runs: dict[str, Any] = {}
        for spec in self.specs:
            record = _record(outputs[spec.label], prompts[spec.label])
            record.update(self._judge(spec.label, prompts[spec.label], outputs))
            if self.settings.keep_outputs:
                record["prompts"] = prompts[spec.label]
                record["outputs"] = [m.tokens for m in outputs[spec.label]]
            runs[spec.label] = record
        return {
            "question_id": question.question_id,
            "category": question.category,
            "fine_category": question.fine_category,
            "turns": len(turns),
            "runs": runs,
        }

    def _judge(self, label: str, prompts: list[list[int]], outputs: dict[str, list[Measurement]]) -> dict[str, Any]:
        """Identity over all turns; a later turn is comparable only while every earlier one was identical."""
        reference = self._references[label]
        for turn, (prompt, mine, theirs) in enumerate(zip(prompts, outputs[label], outputs[reference], strict=True)):
            verdict = self.judge(prompt, mine, theirs, self._by_label[label], self._by_label[reference])
            if not verdict["identical"]:
                return {**verdict, "difference_turn": turn}
        return {"identical": True, "near_tie": False, "near_boundary": False, "first_difference": None,
                "margin": None, "boundary": None, "difference_turn": None}

    def run(self, questions: Sequence[Question], progress: bool = True) -> dict[str, Any]:
        """Measure every question not already done, saving after each; returns the results."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        todo = [q for q in questions if q.question_id not in self.done]
        if not todo:
            return self.finish()
        self.warm_up(todo[0], todo)
        start = len(self.results["questions"])
        bar = tqdm(total=len(todo) * len(self.methods), desc="bench", unit="run", disable=not progress,
                   file=sys.stderr)
        try:
            for offset, question in enumerate(todo):
                def tick(label: str, question_id: int = question.question_id) -> None:
                    bar.set_postfix_str(f"q{question_id} {label}", refresh=False)
                    bar.update(1)

                self.results["questions"].append(self.measure(question, start + offset, tick))
                write_json_atomic(self.path, self.results)
        finally:
            bar.close()
        return self.finish()

    def finish(self) -> dict[str, Any]:
        self.results["meta"]["finished"] = now()
        self.results["meta"]["load_average_end"] = machine_info()["load_average"]
        self.results["summary"] = summarize(self.results)
        write_json_atomic(self.path, self.results)
        self.meter.close()
        return self.results


def references(specs: Sequence[MethodSpec]) -> dict[str, str]:
    """``{label: reference label}``: greedy methods are judged against the first greedy baseline
    (or the first method), a sampled one against plain decoding sampling alike, which must be there."""
    reference = next((s for s in specs if s.is_greedy_baseline), specs[0])
    judged = {spec.label: reference.label for spec in specs}
    for spec in specs:
        if not spec.sampling:
            continue
        options = ":".join(f"{k}={v}" for k, v in spec.sampling.items())
        if "seed" not in spec.sampling:
            raise SpecDecError(f"method {spec.label!r} samples without a seed: add seed=N (its output is judged "
                               "against plain sampling with the same seed)")
        same = [s for s in specs if s.is_sampled_baseline and s.sampling == spec.sampling]
        if not same:
            raise SpecDecError(f"method {spec.label!r} samples: add 'none:{options}' to the methods, "
                               "the reference its output is judged against")
        judged[spec.label] = same[0].label
    return judged
