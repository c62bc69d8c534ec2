"""What a user gets: ``specdec.run`` with default arguments, one call per prompt, against Hugging Face.

The Spec-Bench runner (:mod:`specdec.bench.runner`) measures long-lived, warmed
:class:`~specdec.Generator` objects. A user's first contact is different: one
``specdec.run(model, prompt, drafter)`` call, in a process that may have done nothing else.
This module measures that, on held-out prompts (``specdec/data/prompts.json``, key
``heldout``: kinds like HumanEval, MBPP, GSM8K and code edits, written for specdec and never
used to tune anything), against Hugging Face's greedy ``model.generate`` on the same token ids:

- **in one process** (:func:`measure_in_process`): one untimed call of every arm first (what
  "after one earlier call" means), then per prompt, interleaved: ``hf`` (``model.generate``,
  greedy), ``run:SPEC`` (a ``specdec.run`` call, timed from call to return: the Generator it
  builds included) and ``generator:SPEC`` (one warmed Generator per spec, reused for every
  prompt: the figure the other benchmarks report, beside what ``run`` gets);
- **in fresh processes** (:func:`measure_fresh`): per prompt a new Python process that imports
  specdec, loads the model, calls ``specdec.run`` once (timed, and the time from the process's
  start to its first token), then times ``model.generate`` on the same ids. One process runs
  before the measured ones (untimed, on a prompt that is not measured), since what the claim is
  about is a machine on which specdec has run before (its calibration, compiled extensions and
  learned statistics cached).

Token Recycling's matrix is the model's, shared by every arm and saved across processes: in
one process every arm on a prompt starts from the matrix the earlier prompts left (restored
before each arm), so no arm drafts from another arm's pass over the same prompt. Across
processes the matrix a measured process loads holds what the earlier processes learned; to
measure a machine that has never seen the measured prompts, point ``SPECDEC_RECYCLING_DIR``
and ``SPECDEC_PLANNER_DIR`` at empty folders (docs/benchmarks.md does).

Speedup is the Spec-Bench definition: the mean over prompts of an arm's tokens/s over the
same mean for ``hf``. Every output is compared with ``hf``'s by
:func:`specdec.testing.compare_outputs` (identical, or first different at a judged near-tie).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from specdec.api import Generator, run
from specdec.bench.methods import MethodSpec, parse_methods
from specdec.bench.plot import grouped_bars, pyplot, save_figure
from specdec.bench.report import markdown_table
from specdec.cachefiles import folder
from specdec.cachefiles import kind as cache_kind
from specdec.decoding import DECODING_OPTIONS
from specdec.drafters import recycling_state
from specdec.errors import SpecDecError
from specdec.hf import HFGenerate, hf_generate
from specdec.models import encode_prompt
from specdec.options import GENERATOR_OPTIONS
from specdec.testing import compare_outputs
from specdec.types import GenerationResult

# What "an earlier call" (in process) and "an earlier process" run: not one of the measured prompts.
WARM_PROMPT = "Write one sentence about the sea."


@dataclass(frozen=True)
class Prompt:
    kind: str
    text: str


def heldout_prompts(extra: bool = False) -> list[Prompt]:
    """The held-out prompts shipped with specdec (module docstring): the 16 every one-off measurement times,
    then, with ``extra``, 48 more of the same kinds (``heldout_extra``), for a batch that streams a list
    several batches long (:mod:`specdec.bench.batched`)."""
    data = json.loads(resources.files("specdec").joinpath("data/prompts.json").read_text(encoding="utf-8"))
    return [Prompt(p["kind"], p["prompt"]) for p in data["heldout"] + (data["heldout_extra"] if extra else [])]


@dataclass
class Timing:
    """One arm on one prompt: the new tokens, the seconds they took, and (specdec arms) the steps."""

    tokens: list[int]
    seconds: float
    steps: int | None = None
    first_token_s: float | None = None  # fresh processes: from the process's start to its first token
    engine: str | None = None  # what ran the forward (specdec arms: GenerationStats.engine)
    split: dict[str, float] | None = None  # specdec arms: where the seconds went (:func:`time_split`)

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else 0.0


@dataclass
class PromptResult:
    prompt: Prompt
    ids: list[int]
    arms: dict[str, Timing] = field(default_factory=dict)
    verdicts: dict[str, str] = field(default_factory=dict)  # arm -> compare_outputs(...).describe()
    acceptable: dict[str, bool] = field(default_factory=dict)


def hf_greedy(model: Any, ids: Sequence[int], max_new_tokens: int) -> Timing:
    """``model.generate`` greedy on ``ids`` (an all-ones attention mask), timed."""
    device = next(model.parameters()).device
    input_ids = torch.tensor([list(ids)], device=device)
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens, do_sample=False
        )
    seconds = time.perf_counter() - started
    return Timing([int(t) for t in out[0, len(ids) :]], seconds)


def time_split(result: GenerationResult, seconds: float) -> dict[str, float]:
    """Where a specdec arm's ``seconds`` went: ``outside`` the generation (``run`` building its
    Generator), the one-time ``calibration``, the ``prefill``, the steps' ``verify`` and ``draft``
    time, and the mean verified tree (``nodes``): what tells a fresh process's loss apart from a
    warmed one's (:func:`fresh_against_warmed`)."""
    stats = result.stats
    return {"outside_s": round(seconds - stats.total_s, 4), "calibration_s": round(stats.calibration_s, 4),
            "prefill_s": round(stats.prefill_s, 4), "verify_s": round(stats.verify_s, 4),
            "draft_s": round(stats.draft_s, 4), "nodes": round(stats.mean_tree_size, 3)}  # fmt: skip


def timed_run(model: Any, tokenizer: Any, ids: Sequence[int], spec: MethodSpec, max_new_tokens: int) -> Timing:
    """One ``specdec.run`` call, timed from the call to its return."""
    started = time.perf_counter()
    result = run(model, list(ids), spec.name, tokenizer=tokenizer, max_new_tokens=max_new_tokens, **spec.options)
    seconds = time.perf_counter() - started
    return Timing(list(result.tokens), seconds, result.stats.steps, engine=result.stats.engine or None,
                  split=time_split(result, seconds))  # fmt: skip


def timed_generate(generator: Generator, ids: Sequence[int], spec: MethodSpec, max_new_tokens: int) -> Timing:
    """One ``generator.generate`` call with the spec's decoding options (``budget=`` and the like), timed."""
    options = {k: v for k, v in spec.options.items() if k in DECODING_OPTIONS}
    started = time.perf_counter()
    result = generator.generate(list(ids), max_new_tokens=max_new_tokens, **options)
    seconds = time.perf_counter() - started
    return Timing(list(result.tokens), seconds, result.stats.steps, engine=result.stats.engine or None,
                  split=time_split(result, seconds))  # fmt: skip


def timed_custom_generate(model: Any, speculative: HFGenerate, ids: Sequence[int], max_new_tokens: int) -> Timing:
    """One ``model.generate(..., custom_generate=speculative)`` call (what a user of ``generate`` keeps, its
    Generator reused across calls), timed: ``run``'s work plus Hugging Face's argument handling around it."""
    device = next(model.parameters()).device
    input_ids = torch.tensor([list(ids)], device=device)
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens,
                             custom_generate=speculative)  # fmt: skip
    seconds = time.perf_counter() - started
    result = speculative.last_result
    assert result is not None, "custom_generate returned without decoding"
    return Timing([int(t) for t in out[0, len(ids) :]], seconds, result.stats.steps,
                  engine=result.stats.engine or None, split=time_split(result, seconds))  # fmt: skip


def _judge(model: Any, result: PromptResult) -> None:
    reference = result.arms["hf"].tokens
    for arm, timing in result.arms.items():
        if arm == "hf":
            continue
        comparison = compare_outputs(model, result.ids, timing.tokens, reference)
        result.verdicts[arm] = comparison.describe()
        result.acceptable[arm] = comparison.acceptable


def measure_in_process(
    model: Any, tokenizer: Any, prompts: Sequence[Prompt], specs: str, max_new_tokens: int, progress: bool = True,
    custom_generate: bool = False,
) -> list[PromptResult]:
    """Every prompt through ``hf``, ``run:SPEC`` and ``generator:SPEC`` arms, interleaved (module docstring);
    with ``custom_generate``, also ``hf_generate:SPEC``: ``model.generate(..., custom_generate=hf_generate(SPEC))``
    with one :func:`specdec.hf_generate` object kept across prompts."""
    methods = parse_methods([specs])
    generators = {
        spec.label: Generator(model, tokenizer, drafter=spec.name, **_generator_options(spec)) for spec in methods
    }
    customs = {spec.label: hf_generate(spec.name, tokenizer=tokenizer, **spec.options)
               for spec in methods} if custom_generate else {}  # fmt: skip
    warm = encode_prompt(tokenizer, WARM_PROMPT, None)
    hf_greedy(model, warm, 8)  # the one earlier call of every arm: what a process has done before
    for spec in methods:
        timed_run(model, tokenizer, warm, spec, 8)
        timed_generate(generators[spec.label], warm, spec, 8)
        if spec.label in customs:
            timed_custom_generate(model, customs[spec.label], warm, 8)
    results = []
    for prompt in tqdm(prompts, desc="one-off calls", disable=not progress):
        ids = encode_prompt(tokenizer, prompt.text, None)
        result = PromptResult(prompt, ids)
        result.arms["hf"] = hf_greedy(model, ids, max_new_tokens)
        # Token Recycling's matrix is shared by every arm on this model: each arm starts from what the
        # earlier prompts taught it, never from another arm's pass over this prompt's own output.
        learned = recycling_state.snapshot_shared()
        for spec in methods:
            recycling_state.restore_shared(learned)
            result.arms[f"run:{spec.label}"] = timed_run(model, tokenizer, ids, spec, max_new_tokens)
            recycling_state.restore_shared(learned)
            result.arms[f"generator:{spec.label}"] = timed_generate(generators[spec.label], ids, spec, max_new_tokens)
            if spec.label in customs:
                recycling_state.restore_shared(learned)
                result.arms[f"hf_generate:{spec.label}"] = timed_custom_generate(model, customs[spec.label], ids,
                                                                                 max_new_tokens)  # fmt: skip
        _judge(model, result)
        results.append(result)
    return results


def _generator_options(spec: MethodSpec) -> dict[str, Any]:
    """A spec's options that a Generator takes at construction (the rest are decoding options)."""
    return {k: v for k, v in spec.options.items() if k in GENERATOR_OPTIONS}


CHILD_FLAG = "--oneoff-child"


def _child_setup(data: dict[str, Any]) -> tuple[Any, Any, MethodSpec]:
    """A measuring child's model, tokenizer and method, from the payload its parent sent."""
    from specdec.models import load_model

    model, tokenizer = load_model(None if data["model"] == "default" else data["model"])
    (spec,) = parse_methods([data["spec"]])
    return model, tokenizer, spec


def child_main(payload: str) -> None:
    """A fresh process's measurement (module docstring): prints one JSON line on stdout."""
    spec_data = json.loads(payload)
    started = float(spec_data["started"])  # the parent's wall clock when it spawned this process
    model, tokenizer, spec = _child_setup(spec_data)
    ids = encode_prompt(tokenizer, spec_data["prompt"], None)
    first: list[float] = []

    def on_tokens(tokens: list[int]) -> None:
        if not first:
            first.append(time.time() - started)

    call = time.perf_counter()
    result = run(
        model, ids, spec.name, tokenizer=tokenizer, max_new_tokens=spec_data["max_new_tokens"], on_tokens=on_tokens,
        **spec.options,
    )  # fmt: skip
    seconds = time.perf_counter() - call
    hf = hf_greedy(model, ids, spec_data["max_new_tokens"])
    print(json.dumps({
        "ids": ids, "run": {"tokens": result.tokens, "seconds": seconds, "steps": result.stats.steps,
                            "first_token_s": first[0] if first else None, "engine": result.stats.engine or None,
                            "split": time_split(result, seconds)},
        "hf": {"tokens": hf.tokens, "seconds": hf.seconds},
    }))  # fmt: skip


WARMED_FLAG = "--oneoff-warmed-child"
LEARNED_KINDS = ("recycling", "planner")  # what a generation learns and later processes load (module docstring)


def warmed_child_main(payload: str) -> None:
    """The warmed arm of :func:`measure_fresh`: one process, one Generator for every prompt in turn,
    after the same untimed earlier generation the fresh sequence starts with.

    It answers the parent over its pipes: one JSON line ``{"ready": true}`` once warmed, then for
    each prompt the parent writes (one JSON string per line) one JSON row (its timing, then Hugging
    Face's on the same ids), until its stdin closes. Between prompts it waits on the pipe, so it
    takes no processor time while the parent runs the next fresh process."""
    data = json.loads(payload)
    model, tokenizer, spec = _child_setup(data)
    options = {"store": False, **_generator_options(spec)}  # store off, as run's default: no outputs shared
    generator = Generator(model, tokenizer, drafter=spec.name, **options)
    timed_generate(generator, encode_prompt(tokenizer, WARM_PROMPT, None), spec, data["max_new_tokens"])
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        ids = encode_prompt(tokenizer, json.loads(line), None)
        timing = timed_generate(generator, ids, spec, data["max_new_tokens"])
        hf = hf_greedy(model, ids, data["max_new_tokens"])
        print(json.dumps({"tokens": timing.tokens, "seconds": timing.seconds, "steps": timing.steps,
                          "engine": timing.engine, "split": timing.split,
                          "hf_tokens": hf.tokens, "hf_seconds": hf.seconds}), flush=True)  # fmt: skip


def _child_command(flag: str, payload: dict[str, Any]) -> list[str]:
    """The command line of a measuring child process: ``specdec bench oneoff FLAG PAYLOAD``."""
    return [sys.executable, "-m", "specdec.commands", "bench", "oneoff", flag, json.dumps(payload)]


def _child(flag: str, payload: dict[str, Any], env: dict[str, str]) -> Any:
    """Run a measuring child process to its end; its last stdout line, parsed."""
    done = subprocess.run(_child_command(flag, payload), capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"the measuring process failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


class _WarmedProcess:
    """The long-lived warmed process of :func:`measure_fresh`, asked one prompt at a time."""

    def __init__(self, payload: dict[str, Any], env: dict[str, str]) -> None:
        # stderr to a file (a full pipe would block the child), closed by close()
        self._errors = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        self._process = subprocess.Popen(
            _child_command(WARMED_FLAG, payload),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._errors, text=True, env=env,
        )  # fmt: skip
        self._read()  # {"ready": true}: loaded and warmed before the first fresh process starts

    def _read(self) -> Any:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            text = line.strip()
            if text.startswith("{"):
                return json.loads(text)
        self._process.wait()
        self._errors.seek(0)
        raise RuntimeError(f"the warmed measuring process failed:\n{self._errors.read()[-4000:]}")

    def ask(self, prompt: str) -> Any:
        """This prompt through the warmed Generator, then Hugging Face's greedy: one row."""
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(prompt) + "\n")
        self._process.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self._process.stdin is not None and not self._process.stdin.closed:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._process.kill()
        self._errors.close()


def measure_fresh(
    model: Any, prompts: Sequence[Prompt], spec: str, max_new_tokens: int, model_name: str = "default",
    progress: bool = True, warmed: bool = True,
) -> list[PromptResult]:
    """One fresh process per prompt, after one untimed process (module docstring).

    ``warmed``: beside them, one long-lived process (``warmed:SPEC``, with its own Hugging
    Face timing ``hf:warmed``) runs the same prompts in the same order through one warmed
    Generator (``store=False``, as ``run``), from the learned state (Token Recycling's matrix,
    the planner statistics) the fresh sequence started from, copied aside first: both sequences
    learn the same outputs in the same order, so what separates them is the fresh process. The
    two take turns, prompt by prompt (the fresh process, then the warmed process on the same
    prompt, each with Hugging Face timed right after it), so both meet the machine in the same
    minute: its memory bandwidth drifts by a third between minutes here, and the budget's
    decisions follow the measured times.
    """
    warmed_process = None
    started_from = None
    if warmed:
        started_from = Path(tempfile.mkdtemp(prefix="specdec-oneoff-"))
        for name in LEARNED_KINDS:
            source = folder(name)
            if source.is_dir():
                shutil.copytree(source, started_from / name)
            else:
                (started_from / name).mkdir()
        env = dict(os.environ)
        env.update({cache_kind(name).env: str(started_from / name) for name in LEARNED_KINDS})
        if progress:
            print("the warmed process: loading, one earlier generation ...", file=sys.stderr)
        warmed_process = _WarmedProcess({"model": model_name, "spec": spec, "max_new_tokens": max_new_tokens}, env)
    results = []
    earlier = Prompt("earlier", WARM_PROMPT)  # not one of the measured prompts: nothing of theirs is learned before
    try:
        for index, prompt in enumerate(tqdm([earlier, *prompts], desc="fresh processes, the warmed process in turn",
                                            disable=not progress)):  # fmt: skip
            payload = {"model": model_name, "spec": spec, "prompt": prompt.text, "max_new_tokens": max_new_tokens,
                       "started": time.time()}  # fmt: skip
            data = _child(CHILD_FLAG, payload, dict(os.environ))
            if index == 0:
                continue  # the earlier process: it leaves what specdec caches on this machine
            result = PromptResult(prompt, data["ids"])
            result.arms["hf"] = Timing(data["hf"]["tokens"], data["hf"]["seconds"])
            run_data = data["run"]
            result.arms[f"run:{spec}"] = Timing(
                run_data["tokens"], run_data["seconds"], run_data["steps"], run_data["first_token_s"],
                run_data.get("engine"), run_data.get("split"),
            )  # fmt: skip
            if warmed_process is not None:
                row = warmed_process.ask(prompt.text)
                result.arms[f"warmed:{spec}"] = Timing(row["tokens"], row["seconds"], row["steps"],
                                                       engine=row.get("engine"), split=row.get("split"))  # fmt: skip
                result.arms["hf:warmed"] = Timing(row["hf_tokens"], row["hf_seconds"])
            results.append(result)
    finally:
        if warmed_process is not None:
            warmed_process.close()
        if started_from is not None:
            shutil.rmtree(started_from, ignore_errors=True)
    for result in results:
        _judge(model, result)
    return results


FRESH_TARGET = 0.95  # issue 30: one fresh process's speedup within 5% of a warmed Generator's
# Fewest prompts an interval over prompts is given a verdict from. A bootstrap resample of P prompts is
# one prompt P times with probability P ** (1 - P): 100% at one prompt (a zero-width interval), 50% at
# two, 11% at three, more than a 90% interval's 5% tail, so the tails would be single prompts' own
# ratios; at four it is 1.6%.
MIN_INTERVAL_PROMPTS = 4


@dataclass(frozen=True)
class RatioInterval:
    """A ratio of speedups and a bootstrap interval over prompts (:func:`fresh_ratio`)."""

    ratio: float
    low: float
    high: float
    level: float  # the interval's coverage, e.g. 0.9
    prompts: int  # prompts the interval resamples

    def verdict(self, target: float = FRESH_TARGET) -> str:
        """Whether this run tells the ratio apart from ``target``: above it, below it, or neither; with fewer
        than :data:`MIN_INTERVAL_PROMPTS` prompts, none (the interval cannot support one)."""
        if self.prompts < MIN_INTERVAL_PROMPTS:
            return (f"insufficient: {self.prompts} prompt(s), an interval over prompts needs at least "
                    f"{MIN_INTERVAL_PROMPTS}")
        if self.low >= target:
            return f"at or above {target:g} (the whole interval)"
        if self.high < target:
            return f"below {target:g} (the whole interval)"
        return f"this run cannot tell it from {target:g} (the interval holds both sides)"

    def to_json(self) -> dict[str, float]:
        return {"ratio": round(self.ratio, 4), "low": round(self.low, 4), "high": round(self.high, 4),
                "level": self.level, "prompts": self.prompts}  # fmt: skip


def fresh_ratio(
    results: Sequence[PromptResult], spec: str, *, draws: int = 2000, level: float = 0.9, seed: int = 0
) -> RatioInterval | None:
    """The fresh processes' speedup over their own ``hf`` against the warmed process's over its own,
    with a bootstrap interval over prompts; None without the warmed arms.

    Why an interval: one run's ratio moves by several points with the prompts it holds (a prompt's
    trees can differ between the two sequences) and with the machine's minutes, while the claim
    under test (:data:`FRESH_TARGET`) is 5 points from 1.0. The interval resamples the prompts
    with replacement, a prompt's four arms together (the pairing is what cancels the machine's
    drift), ``draws`` times from ``seed`` (the same results give the same interval), and takes the
    central ``level`` of the ratios. It is the spread over prompts within the run; the spread of the
    warmed process itself (one draw of a process's speed, docs/benchmarks.md) is not in it.
    """
    warmed = f"warmed:{spec}"
    if not results or warmed not in results[0].arms:
        return None
    arms = (f"run:{spec}", "hf", warmed, "hf:warmed")
    rates = np.array([[r.arms[arm].tokens_per_s for arm in arms] for r in results], dtype=np.float64)  # [P, 4]

    def ratios(means: np.ndarray) -> np.ndarray:  # [..., 4] mean tokens/s -> [...] ratio of speedups
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.asarray((means[..., 0] / means[..., 1]) / (means[..., 2] / means[..., 3]))

    point = float(ratios(rates.mean(axis=0)))
    picks = np.random.default_rng(seed).integers(0, len(results), size=(draws, len(results)))
    samples = ratios(rates[picks].mean(axis=1))
    samples = samples[np.isfinite(samples)]
    if not np.isfinite(point) or samples.size == 0:
        return None
    low, high = np.quantile(samples, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return RatioInterval(point, float(low), float(high), level, len(results))


def fresh_against_warmed(
    results: Sequence[PromptResult], spec: str, interval: RatioInterval | None = None
) -> str | None:
    """One line: the fresh processes' speedup over their own ``hf`` against the warmed process's over its own,
    with :func:`fresh_ratio`'s interval and verdict (``interval``: that result, when the caller has it).

    Each process's speedup is over Hugging Face timed in that process, so a drift of the machine's
    speed between the two sequences (memory bandwidth moves by a third between minutes here)
    cancels; the raw ratio of mean tokens/s is given beside it. (From the results, not from
    :func:`summarize`'s table, whose tokens/s are rounded to two decimals.)
    """
    warmed = f"warmed:{spec}"
    interval = interval or fresh_ratio(results, spec)
    if interval is None:
        return None

    def mean(arm: str) -> float:
        return sum(r.arms[arm].tokens_per_s for r in results) / len(results)

    fresh_speedup, warmed_speedup = mean(f"run:{spec}") / mean("hf"), mean(warmed) / mean("hf:warmed")
    line = (f"fresh processes against the warmed process: {fresh_speedup:.2f}x vs {warmed_speedup:.2f}x their own "
            f"HF greedy = {interval.ratio:.3f} (raw tokens/s ratio {mean(f'run:{spec}') / mean(warmed):.3f}; "
            f"{interval.level:.0%} interval over prompts {interval.low:.3f}-{interval.high:.3f}: "
            f"{interval.verdict()})")  # fmt: skip
    return line + _split_line([r.arms[f"run:{spec}"] for r in results], [r.arms[warmed] for r in results])


def _split_line(fresh: Sequence[Timing], warmed: Sequence[Timing]) -> str:
    """Where the fresh processes' seconds went against the warmed process's, per prompt (means), or ''."""
    if any(t.split is None for t in [*fresh, *warmed]):
        return ""

    def per_prompt(timings: Sequence[Timing], key: str) -> float:
        return sum((t.split or {})[key] for t in timings) / len(timings)

    def per_step(timings: Sequence[Timing]) -> float:
        return sum((t.split or {})["verify_s"] for t in timings) / max(1, sum(t.steps or 0 for t in timings))

    parts = [f"{name} {per_prompt(fresh, key) * 1e3:.0f} vs {per_prompt(warmed, key) * 1e3:.0f} ms"
             for name, key in (("outside the generation", "outside_s"), ("calibration", "calibration_s"),
                               ("prefill", "prefill_s"))]  # fmt: skip
    parts.append(f"verification {per_step(fresh) * 1e3:.1f} vs {per_step(warmed) * 1e3:.1f} ms a step over "
                 f"{per_prompt(fresh, 'nodes'):.2f} vs {per_prompt(warmed, 'nodes'):.2f} nodes")  # fmt: skip
    return "; per prompt, fresh vs warmed: " + ", ".join(parts)


def summarize(results: Sequence[PromptResult]) -> dict[str, Any]:
    """Per kind and overall: every arm's mean tokens/s, its speedup over ``hf`` and its MAT."""
    arms = list(results[0].arms)
    kinds = [*dict.fromkeys(r.prompt.kind for r in results), "overall"]
    table: dict[str, Any] = {}
    for kind in kinds:
        chosen = [r for r in results if kind in ("overall", r.prompt.kind)]
        hf = sum(r.arms["hf"].tokens_per_s for r in chosen) / len(chosen)
        row = {}
        for arm in arms:
            mean = sum(r.arms[arm].tokens_per_s for r in chosen) / len(chosen)
            tokens = sum(len(r.arms[arm].tokens) for r in chosen)
            steps = sum(r.arms[arm].steps or 0 for r in chosen)
            row[arm] = {"tokens_per_s": round(mean, 2), "speedup": round(mean / hf, 3) if hf else None,
                        "mat": round(tokens / steps, 3) if steps else None}  # fmt: skip
        table[kind] = row
    first_tokens = sorted(t.first_token_s for r in results for t in r.arms.values() if t.first_token_s is not None)
    return {
        "table": table,
        "identical": {arm: sum(r.verdicts.get(arm) == "identical" for r in results) for arm in arms if arm != "hf"},
        "acceptable": {arm: sum(r.acceptable.get(arm, False) for r in results) for arm in arms if arm != "hf"},
        "prompts": len(results),
        "first_token_s": round(first_tokens[len(first_tokens) // 2], 3) if first_tokens else None,
        "engines": sorted({t.engine for r in results for t in r.arms.values() if t.engine}),
    }


def format_summary(summary: dict[str, Any]) -> str:
    """Markdown: speedup over ``hf`` (tokens/s, MAT) per kind and arm."""
    table = summary["table"]
    arms = [arm for arm in next(iter(table.values())) if arm != "hf"]
    rows = []
    for kind, row in table.items():
        cells = [kind, f"{row['hf']['tokens_per_s']:.1f}"]
        for arm in arms:
            mat = row[arm]["mat"]
            detail = f"{row[arm]['tokens_per_s']:.1f}" + (f", MAT {mat:.2f}" if mat else "")
            cells.append(f"{row[arm]['speedup']:.2f}x ({detail})")
        rows.append(cells)
    lines = [markdown_table(["kind", "hf tok/s", *arms], rows)]
    lines.append(
        f"\n{summary['prompts']} prompts; identical to hf: {summary['identical']}; identical or first different at "
        f"a near-tie: {summary['acceptable']}; engines: {', '.join(summary['engines'])}"
    )
    if summary["first_token_s"] is not None:
        lines.append(f"median time from process start to first token: {summary['first_token_s']:.2f} s")
    return "\n".join(lines)


def load_saved(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """A saved one-off run's ``results.json`` (``directory`` or the file itself)."""
    path = Path(directory)
    path = path / "results.json" if path.is_dir() else path
    try:
        saved: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise SpecDecError(f"no readable one-off results at {str(directory)!r}: {error}") from None
    if not isinstance(saved.get("summary"), dict) or "table" not in saved["summary"]:
        raise SpecDecError(f"{path} is not a `specdec bench oneoff` results file (no summary table)")
    return saved


def plot(summary: dict[str, Any], path: str | Path, title: str) -> Path:
    """Speed-up over HF greedy ``generate`` per prompt kind and overall, one bar per arm (tokens/s on each bar)."""
    plt = pyplot()

    table = summary["table"]
    kinds = list(table)
    arms = [arm for arm in table[kinds[-1]] if arm != "hf"]
    figure, axes = plt.subplots(figsize=(max(6.0, 1.4 * len(kinds) + 1.5), 4.0))
    series = {}
    for arm in arms:
        cells = [table[kind].get(arm, {}) for kind in kinds]
        series[arm] = ([c.get("speedup") or 0.0 for c in cells],
                       [f"{c.get('speedup') or 0:.2f}x\n{c.get('tokens_per_s') or 0:.0f}" for c in cells])  # fmt: skip
    grouped_bars(axes, len(kinds), series, baseline="HF greedy generate")
    ticks = [f"{kind}\n(HF {table[kind]['hf']['tokens_per_s']:.1f} tok/s)" for kind in kinds]
    axes.set_xticks(range(len(kinds)), ticks, fontsize=8)
    axes.set_ylabel("tokens/s over HF greedy generate's")
    axes.set_ylim(0, 1.4 * max([1.0, *(table[kind][arm]["speedup"] or 0 for kind in kinds for arm in arms)]))
    axes.set_title(textwrap.fill(title, 90), fontsize=8)
    axes.legend(fontsize=7, ncols=min(3, len(arms) + 1), loc="upper left")
    return save_figure(figure, path)


def to_json(results: Sequence[PromptResult]) -> list[dict[str, Any]]:
    return [
        {"kind": r.prompt.kind, "prompt": r.prompt.text, "ids": r.ids, "verdicts": r.verdicts,
         "arms": {arm: {"tokens": t.tokens, "seconds": t.seconds, "steps": t.steps, "first_token_s": t.first_token_s,
                        "engine": t.engine, "split": t.split} for arm, t in r.arms.items()}}
        for r in results
    ]  # fmt: skip
