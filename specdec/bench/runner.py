"""The Spec-Bench runner: every method on every question, interleaved, saved as it goes.

For each question, every method generates its answer in turn (the order rotates from one
question to the next), so slow drift of a shared machine (other jobs, thermal state)
hits all methods alike instead of whichever ran last. Each method is warmed up once on a
short generation before any timed run: first calls pay one-time costs (allocator growth,
lazy imports, kernel selection) that are not decoding speed.

Per question and method the runner records new tokens, wall time, target forwards
(steps), MAT, tokens/s, the time inside the model's forwards and outside them, specdec's
draft/verify/other split, and whether the output is token-identical to the reference
greedy baseline (the first ``none`` or ``hf-generate`` method), or differs first on a
near-tie (:func:`specdec.testing.compare_outputs`). ``results.json`` is rewritten after
every question (atomically), so an interrupted run keeps what it measured and
``resume=True`` continues it.

With ``turns=2``, questions that have a second turn (MT-Bench's) ask it after each method's
own first answer, as Spec-Bench does; the figures of both turns add up per question.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdec.bench.methods import ForwardMeter, Measurement, Method, MethodSpec, build_methods
from specdec.bench.questions import Question
from specdec.errors import SpecDecError
from specdec.models import encode_prompt

RESULTS_FORMAT = "specdec-bench/1"
RESULTS_FILE = "results.json"


@dataclass(frozen=True)
class BenchSettings:
    """What makes two runs comparable; a resumed run must match the saved one exactly."""

    model: str
    max_new_tokens: int = 128
    turns: int = 1
    backend: str = "auto"
    datastores: tuple[str, ...] = ()
    warmup_tokens: int = 16

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
            "backend": self.backend, "datastores": list(self.datastores), "warmup_tokens": self.warmup_tokens,
        }


def machine_info() -> dict[str, Any]:
    """The hardware and load a run saw: timings mean little without it."""
    import torch

    cpu = platform.processor() or ""
    memory_gib = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            cpu = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), cpu)
        with open("/proc/meminfo", encoding="utf-8") as handle:
            kib = next((int(line.split()[1]) for line in handle if line.startswith("MemTotal")), None)
            memory_gib = None if kib is None else round(kib / 2**20, 1)
    except OSError:
        pass
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_gib": memory_gib,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
    }


def software_versions() -> dict[str, Any]:
    import numpy
    import torch
    import transformers

    import specdec

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": numpy.__version__,
        "specdec": specdec.__version__,
        "git": _git_state(),
    }


def _git_state() -> dict[str, Any] | None:
    """The checkout's commit and whether it had uncommitted changes (None outside git)."""
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if commit.returncode != 0:
        return None
    return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}


def model_info(model: Any, spec: str) -> dict[str, Any]:
    """What was benchmarked; ``spec`` is how the user named it (``default`` or a path)."""
    from specdec.models import DEFAULT_GGUF_NAME

    parameter = next(model.parameters())
    return {
        "name": DEFAULT_GGUF_NAME.split(".")[0] if spec == "default" else Path(spec).name,
        "name_or_path": str(getattr(model.config, "name_or_path", "") or type(model).__name__),
        "architecture": type(model).__name__,
        "dtype": str(parameter.dtype).removeprefix("torch."),
        "device": str(parameter.device),
        "parameters": sum(p.numel() for p in model.parameters()),
        "attention": getattr(model.config, "_attn_implementation", None),
    }


def file_digest(path: str | os.PathLike[str]) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def output_digest(tokens: Sequence[int]) -> str:
    """A short fingerprint of an output, so two saved runs can tell which answers changed."""
    return hashlib.sha1(json.dumps(list(tokens)).encode()).hexdigest()[:12]


def write_json_atomic(path: Path, data: Any) -> None:
    """Write to a temporary file and rename it into place: a crash never leaves half a file."""
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(json.dumps(data, indent=1), encoding="utf-8")
    os.replace(staging, path)


def _turn_prompt(tokenizer: Any, question: Question, answers: Sequence[str]) -> list[int]:
    """The chat for the next turn: every earlier turn with this method's own answer to it."""
    if not answers:
        return encode_prompt(tokenizer, question.turns[0])
    messages: list[dict[str, str]] = []
    for turn, answer in zip(question.turns, answers, strict=False):
        messages += [{"role": "user", "content": turn}, {"role": "assistant", "content": answer}]
    messages.append({"role": "user", "content": question.turns[len(answers)]})
    return encode_prompt(tokenizer, messages)


class Judge:
    """Decides whether an output equals the reference greedy output, or differs on a near-tie."""

    def __init__(self, model: Any) -> None:
        self._model = model

    def __call__(self, prompt: Sequence[int], output: Sequence[int], reference: Sequence[int]) -> dict[str, Any]:
        from specdec.testing import compare_outputs

        comparison = compare_outputs(self._model, prompt, output, reference)
        return {
            "identical": comparison.identical,
            "near_tie": (not comparison.identical) and comparison.near_tie,
            "first_difference": comparison.first_difference,
            "margin": None if comparison.margin is None else round(comparison.margin, 6),
        }


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
        "stop_reason": [m.stop_reason for m in measurements],
        "output_sha1": [output_digest(m.tokens) for m in measurements],
    }


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
        self.meter = ForwardMeter(model)
        self.methods: list[Method] = build_methods(
            self.specs, model, tokenizer, self.meter, backend=settings.backend, datastores=settings.datastores
        )
        reference = next((s for s in self.specs if s.is_greedy_baseline), self.specs[0])
        # A sampled method is judged against plain decoding that samples alike (same seed).
        self._references = {spec.label: reference.label for spec in self.specs}
        for spec in self.specs:
            if spec.sampling:
                same = [s for s in self.specs if s.is_sampled_baseline and s.sampling == spec.sampling]
                if not same:
                    options = ":".join(f"{k}={v}" for k, v in spec.sampling.items())
                    raise SpecDecError(f"method {spec.label!r} samples: add 'none:{options}' to the methods, "
                                       "the reference its output is judged against")
                self._references[spec.label] = same[0].label
        self.judge = Judge(model)
        self.results: dict[str, Any] = {
            "format": RESULTS_FORMAT,
            "meta": {
                "command": command,
                "argv": sys.argv,
                "started": _now(),
                "finished": None,
                "machine": machine_info(),
                "versions": software_versions(),
                "model": model_info(model, settings.model),
                "settings": settings.to_json(),
                "questions_file": None if questions_file is None else str(questions_file),
                "questions_sha256": None if questions_file is None else file_digest(questions_file),
            },
            "methods": [s.to_json() for s in self.specs],
            "baseline": self.specs[0].label,
            "reference": reference.label,
            "references": dict(self._references),
            "questions": [],
        }
        self._reference = reference.label
        if self.path.exists():
            if not resume:
                raise SpecDecError(f"{self.path} exists: pass --resume to continue that run, or choose another --out")
            self._load_for_resume()

    def _load_for_resume(self) -> None:
        saved = json.loads(self.path.read_text(encoding="utf-8"))
        if saved.get("format") != RESULTS_FORMAT:
            raise SpecDecError(f"{self.path} is not a {RESULTS_FORMAT} results file (format {saved.get('format')!r})")
        mismatch = [
            name for name, ours, theirs in (
                ("settings", self.results["meta"]["settings"], saved["meta"].get("settings")),
                ("methods", self.results["methods"], saved.get("methods")),
                ("questions file", self.results["meta"]["questions_sha256"], saved["meta"].get("questions_sha256")),
            ) if ours != theirs
        ]
        if mismatch:
            raise SpecDecError(f"cannot resume {self.path}: its {mismatch[0]} differ from this run's")
        saved["meta"].setdefault("resumed", []).append({"at": _now(), "machine": self.results["meta"]["machine"]})
        saved["meta"]["finished"] = None
        self.results = saved

    @property
    def done(self) -> set[int]:
        return {q["question_id"] for q in self.results["questions"]}

    def warm_up(self, question: Question) -> None:
        """Two short generations per method, untimed: first calls pay one-time costs.

        The second prompt repeats the first one's ending, so that drafters find something to
        draft and anything done on a first draft (the budget planner's calibration) happens here.
        """
        prompt = _turn_prompt(self.tokenizer, question, [])
        tail = prompt[-256:]
        for method in self.methods:
            prepare = getattr(method, "prepare", None)
            if prepare is not None:
                prepare()
            method.generate(prompt, self.settings.warmup_tokens)
            method.generate([*prompt, *tail, *tail], self.settings.warmup_tokens)

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
            reference = outputs[self._references[spec.label]]
            record.update(self._judge(prompts[spec.label], outputs[spec.label], reference))
            runs[spec.label] = record
        return {
            "question_id": question.question_id,
            "category": question.category,
            "fine_category": question.fine_category,
            "turns": len(turns),
            "runs": runs,
        }

    def _judge(self, prompts: list[list[int]], ours: list[Measurement], reference: list[Measurement]) -> dict[str, Any]:
        """Identity over all turns; a later turn is comparable only while every earlier one was identical."""
        for turn, (prompt, mine, theirs) in enumerate(zip(prompts, ours, reference, strict=True)):
            verdict = self.judge(prompt, mine.tokens, theirs.tokens)
            if not verdict["identical"]:
                return {**verdict, "difference_turn": turn}
        return {"identical": True, "near_tie": False, "first_difference": None, "margin": None, "difference_turn": None}

    def run(self, questions: Sequence[Question], progress: bool = True) -> dict[str, Any]:
        """Measure every question not already done, saving after each; returns the results."""
        from tqdm import tqdm

        self.out_dir.mkdir(parents=True, exist_ok=True)
        todo = [q for q in questions if q.question_id not in self.done]
        if not todo:
            return self.finish()
        self.warm_up(todo[0])
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
        from specdec.bench.report import summarize

        self.results["meta"]["finished"] = _now()
        self.results["meta"]["load_average_end"] = machine_info()["load_average"]
        self.results["summary"] = summarize(self.results)
        write_json_atomic(self.path, self.results)
        self.meter.close()
        return self.results


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
