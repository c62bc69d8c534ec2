"""Many prompts at once: aggregate tokens/s by batch size, specdec's batches against Hugging Face's.

Every arm decodes the same list of prompts (the held-out prompts, ``specdec/data/prompts.json``)
greedily at each batch size ``B``, and the figure is the aggregate: all rows' new tokens over
the seconds the whole list took. The arms:

- ``SPEC`` (a specdec method spec: ``none``, ``sam+recycling``, ...): one warmed
  :class:`~specdec.Generator` per spec, reused at every ``B``, running
  :meth:`~specdec.Generator.generate_batch` (continuous batching, one verification forward
  per step over every row);
- ``hf-generate``: Hugging Face's ``model.generate``, greedy, the prompts in groups of ``B``
  left-padded into one tensor (a group runs until its longest row ends; a row's tokens are
  counted up to its first EOS); ``hf-static`` the same on Hugging Face's static cache with the
  decoding forward compiled (``hf-static:compile=false``: uncompiled), as the Spec-Bench peer
  of that name (:data:`specdec.bench.methods.PEERS`);
- ``single:SPEC`` (``B = 1`` only): the same Generator's :meth:`~specdec.Generator.generate`,
  one prompt after another: the single-sequence path the batch's ``B = 1`` is compared with.

At each ``B`` the arms run one after another (interleaved, the order rotating with ``B``),
after one untimed call of every arm on other prompts. Every timed run starts from the same
learned state, one that has never seen the measured prompts: Token Recycling's matrix is
shared by a model's generators, learns from every output and is saved across processes, so
it would otherwise draft the prompts' outputs from memory (at a later ``B``, or in any run
after a first one on this machine: a greedy output's successors are exactly what the matrix
keeps). So the matrix is emptied, warmed on the warm-up prompts only, and put back to that
state before each timed run; at the end the matrix the process started with is put back and
saved, so the measured prompts' outputs are not kept either. A ``Generator`` keeps what its
drafters learned from its own answers (``sam``'s store of earlier outputs), so every timed run
gets a new one (the untimed calls before have paid for calibration and compiled kernels).

Each specdec arm's run is also split (:func:`step_split`) into its full-batch steps, every place busy
(the pace a long list keeps between its prefills), and its tail, the steps with fewer rows once no
prompt is left: plain decoding's rows all run ``max_new_tokens`` unless an EOS comes first, so a wave
of them ends together, while drafting rows end at different steps and the last ones run alone. A list
of a few batches pays that tail in full (``--prompts 64`` streams 48 more held-out prompts of the same
kinds after the 16).

Every row of every arm is compared with its own single-sequence plain decoding (the ``none``
spec at ``B = 1``, or, without one, a lone ``specdec.run(drafter="none")``) by
:func:`specdec.testing.compare_outputs`: identical, or first different at a judged near-tie.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from specdec.api import Generator
from specdec.bench.methods import PEERS, MethodSpec, parse_methods, peer_arguments
from specdec.bench.plot import pyplot, save_figure
from specdec.bench.report import markdown_table
from specdec.drafters.recycling_state import clear_shared, restore_shared, snapshot_shared
from specdec.errors import SpecDecError
from specdec.models import encode_prompt, eos_token_ids
from specdec.options import GENERATOR_OPTIONS
from specdec.testing import compare_outputs
from specdec.types import GenerationResult

HF = "hf-generate"
BATCHED_PEERS = (HF, "hf-static")  # Hugging Face's methods that take a batch (prompt lookup refuses one)
SINGLE = "single:"
WARM_UP = ("Write one sentence about the sea.", "List three prime numbers.")  # not among the measured prompts


@dataclass
class ArmRun:
    """One arm decoding the whole list at one batch size: every row's tokens and the list's seconds."""

    arm: str
    batch_size: int
    rows: list[list[int]]
    seconds: float
    steps: int | None = None
    verdicts: list[str] = field(default_factory=list)
    acceptable: int = 0
    identical: int = 0
    peer: bool = False  # a Hugging Face arm (BATCHED_PEERS): what specdec's arms are compared with
    split: dict[str, float] | None = None  # where a specdec arm's steps went (:func:`step_split`)

    @property
    def tokens(self) -> int:
        return sum(len(row) for row in self.rows)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"arm": self.arm, "batch_size": self.batch_size, "tokens": self.tokens, "seconds": self.seconds,
                "tokens_per_s": round(self.tokens_per_s, 3), "steps": self.steps, "identical": self.identical,
                "acceptable": self.acceptable, "peer": self.peer, "split": self.split, "verdicts": self.verdicts,
                "rows": self.rows}  # fmt: skip


def step_split(results: Sequence[GenerationResult]) -> dict[str, float]:
    """Where a batched run's steps went, from its rows' step records (each batched step's ``step_s`` is in
    every one of its ``batch_rows`` rows' records, so a record counts ``step_s / batch_rows``):

    - ``full_s``, ``full_tokens``: the steps in which every place held a row (the most rows any step
      had), and the tokens they emitted: the pace a long list keeps between its prefills;
    - ``tail_s``, ``tail_tokens``: the steps with fewer rows, which come once the list has no prompt left
      to take a finished row's place (rows that finish at different steps leave the last ones alone).

    The run's other seconds are its prefills (a joining row's prefill holds up the batch) and the loop's
    bookkeeping."""
    records = [record for result in results for record in result.stats.records]
    places = max((record.batch_rows for record in records), default=1)
    split = {"full_s": 0.0, "full_tokens": 0.0, "tail_s": 0.0, "tail_tokens": 0.0}
    for record in records:
        part = "full" if record.batch_rows == places else "tail"
        split[f"{part}_s"] += record.step_s / record.batch_rows
        split[f"{part}_tokens"] += record.accepted + 1
    return {key: round(value, 4) for key, value in split.items()}


def hf_batched(
    model: Any, eos: Sequence[int], pad: int, prompts: Sequence[Sequence[int]], batch_size: int,
    max_new_tokens: int, arguments: dict[str, Any] | None = None,
) -> tuple[list[list[int]], float]:  # fmt: skip
    """``model.generate`` greedy over ``prompts`` in left-padded groups of ``batch_size``: each row's new
    tokens (up to and with its first EOS) and the seconds all groups took. ``arguments``: more ``generate``
    arguments (a peer's: :func:`~specdec.bench.methods.peer_arguments`)."""
    device = next(model.parameters()).device
    rows: list[list[int]] = []
    seconds = 0.0
    for first in range(0, len(prompts), batch_size):
        group = prompts[first : first + batch_size]
        width = max(len(p) for p in group)
        ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in group], device=device)  # [B, W]
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group], device=device)  # [B, W]
        started = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                 eos_token_id=list(eos) or None, pad_token_id=pad, **(arguments or {}))  # fmt: skip
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds += time.perf_counter() - started
        for row in out[:, width:].tolist():
            end = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
            rows.append([int(t) for t in row[:end]])
    return rows, seconds


def _generator_options(spec: MethodSpec) -> tuple[dict[str, Any], dict[str, Any]]:
    """A spec's options split into the Generator's (construction) and the decoding ones."""
    construction = {k: v for k, v in spec.options.items() if k in GENERATOR_OPTIONS}
    return construction, {k: v for k, v in spec.options.items() if k not in GENERATOR_OPTIONS}


class Arms:
    """The arms of a batch measurement (module docstring), built once and warmed."""

    def __init__(self, model: Any, tokenizer: Any, specs: str) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.eos = eos_token_ids(model, tokenizer)
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad = int(pad) if pad is not None else (self.eos[0] if self.eos else 0)
        self.specs: list[MethodSpec] = []
        self.peers: dict[str, dict[str, Any]] = {}  # label -> generate arguments
        for spec in parse_methods([specs]):
            if spec.name in BATCHED_PEERS:
                self.peers[spec.label] = peer_arguments(PEERS[spec.name], spec.options)
            elif spec.is_peer:
                raise SpecDecError(f"{spec.label!r}: the batch benchmark's peers are {', '.join(BATCHED_PEERS)} "
                                   "(batched, greedy)")
            elif spec.sampling:
                raise SpecDecError(f"{spec.label!r}: the batch benchmark is greedy (sampled rows: the tests)")
            else:
                self.specs.append(spec)
        self.generators: dict[str, tuple[Generator, dict[str, Any]]] = {}
        for spec in self.specs:
            self.generators[spec.label] = self._fresh(spec)

    def _fresh(self, spec: MethodSpec) -> tuple[Generator, dict[str, Any]]:
        """A new Generator of ``spec`` (and its decoding options): a Generator keeps what its drafters
        learned from its own outputs (``sam``'s store of earlier answers), so every timed run gets its own."""
        construction, decoding = _generator_options(spec)
        return Generator(self.model, self.tokenizer, drafter=spec.name, **construction), decoding

    def save_learned(self) -> None:
        """Save the shared Token Recycling matrices as they are now (where the planner cache is on)."""
        for generator, _ in self.generators.values():
            if generator.context.recycling is not None:
                generator.context.recycling.save()

    @property
    def labels(self) -> list[str]:
        return [*(spec.label for spec in self.specs), *self.peers]

    def run(self, arm: str, prompts: Sequence[Sequence[int]], batch_size: int, max_new_tokens: int) -> ArmRun:
        """``arm`` over every prompt at ``batch_size``, timed."""
        if arm in self.peers:
            rows, seconds = hf_batched(self.model, self.eos, self.pad, prompts, batch_size, max_new_tokens,
                                       self.peers[arm])  # fmt: skip
            return ArmRun(arm, batch_size, rows, seconds, peer=True)
        single = arm.startswith(SINGLE)
        spec = next(spec for spec in self.specs if spec.label == arm.removeprefix(SINGLE))
        previous = self.generators.pop(spec.label, None)
        if previous is not None:
            previous[0].close()  # its captured graphs (on a GPU) go to the new one instead of being captured again
        generator, decoding = self.generators[spec.label] = self._fresh(spec)
        started = time.perf_counter()
        if single:
            results = [generator.generate(list(p), max_new_tokens=max_new_tokens, **decoding) for p in prompts]
        else:
            results = generator.generate_batch([list(p) for p in prompts], batch_size=batch_size,
                                               max_new_tokens=max_new_tokens, **decoding)  # fmt: skip
        seconds = time.perf_counter() - started
        return ArmRun(arm, batch_size, [list(r.tokens) for r in results], seconds, sum(r.stats.steps for r in results),
                      split=step_split(results))  # fmt: skip


def measure(
    model: Any, tokenizer: Any, texts: Sequence[str], specs: str, batch_sizes: Sequence[int], max_new_tokens: int,
    progress: bool = True, repeats: int = 1,
) -> list[ArmRun]:
    """Every arm at every batch size (module docstring), ``repeats`` rounds of the whole plan one after
    another (:func:`summarize` takes each figure's median); each run's rows judged against plain decoding."""
    if not batch_sizes or any(b < 1 for b in batch_sizes):
        raise SpecDecError(f"batch sizes must be positive ints, got {list(batch_sizes)}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise SpecDecError(f"repeats must be a positive int, got {repeats!r}")
    if not texts:
        raise SpecDecError("no prompts to decode")
    arms = Arms(model, tokenizer, specs)
    prompts = [encode_prompt(tokenizer, text, None) for text in texts]
    plan = []
    for k, batch in enumerate(batch_sizes):
        labels = arms.labels
        shift = k % len(labels)
        order = labels[shift:] + labels[:shift]  # interleaved: who runs first rotates with B
        if batch == 1:
            order += [SINGLE + spec.label for spec in arms.specs]
        plan += [(arm, batch) for arm in order]
    warm = [encode_prompt(tokenizer, text, None) for text in WARM_UP]
    for arm, batch in dict.fromkeys(plan):  # one untimed call of every arm: calibration, compiled kernels, caches
        arms.run(arm, warm, batch, 8)
    saved = snapshot_shared()  # what this machine's earlier runs left (module docstring)
    runs = []
    try:
        clear_shared()
        for arm, batch in dict.fromkeys(plan):
            arms.run(arm, warm, batch, 8)
        learned = snapshot_shared()  # warmed on the warm-up prompts alone
        for arm, batch in tqdm(plan * repeats, desc="batched runs", disable=not progress):
            restore_shared(learned)  # no run drafts from an earlier run's outputs
            runs.append(arms.run(arm, prompts, batch, max_new_tokens))
    finally:
        restore_shared(saved)
        arms.save_learned()
    reference = next((r.rows for r in runs if r.arm == "none" and r.batch_size == 1), None)
    if reference is None:
        from specdec.api import run

        reference = [list(run(model, p, "none", tokenizer=tokenizer, max_new_tokens=max_new_tokens).tokens)
                     for p in prompts]  # fmt: skip
    for arm_run in runs:
        for prompt, ours, theirs in zip(prompts, arm_run.rows, reference, strict=True):
            comparison = compare_outputs(model, prompt, ours, theirs)
            arm_run.verdicts.append(comparison.describe())
            arm_run.identical += comparison.identical
            arm_run.acceptable += comparison.acceptable
    return runs


def summarize(runs: Sequence[ArmRun]) -> dict[str, Any]:
    """Tokens/s by batch size and arm (the median over repeated runs), and the ratios the issue asks for: each
    spec over ``none`` and over ``hf-generate`` at the same ``B``, and ``B = 1`` batched over the
    single-sequence path.

    A ratio is the median over repeats of the ratio within each repeat (the ``k``-th runs of the two
    arms at that ``B``, which ran one after the other), not the ratio of the two medians: this
    machine's speed drifts by 10-30% between minutes, and arms of one repeat meet the same minute.
    With one run each, the two are the same."""
    rates: dict[int, dict[str, list[float]]] = {}
    for r in runs:
        rates.setdefault(r.batch_size, {}).setdefault(r.arm, []).append(r.tokens_per_s)
    table = {batch: {arm: round(float(np.median(values)), 2) for arm, values in row.items()}
             for batch, row in rates.items()}  # fmt: skip
    identical: dict[str, list[int]] = {}
    acceptable: dict[str, list[int]] = {}
    for r in runs:
        for counts, value in ((identical, r.identical), (acceptable, r.acceptable)):
            total = counts.setdefault(f"{r.arm}@{r.batch_size}", [0, 0])
            total[0] += value
            total[1] += len(r.rows)
    peers = list(dict.fromkeys(r.arm for r in runs if r.peer))
    ratios: dict[int, dict[str, float]] = {}
    for batch, row in rates.items():
        out: dict[str, float] = {}
        for arm in row:
            if arm.startswith(SINGLE) or arm in peers:
                continue
            others = [name for name in ("none", *peers, SINGLE + arm) if name != arm and name in row]
            for other in others:
                paired = [mine / theirs for mine, theirs in zip(row[arm], row[other], strict=True) if theirs > 0]
                if paired:
                    out[f"{arm} / {other}"] = round(float(np.median(paired)), 3)
        ratios[batch] = out
    return {
        "tokens_per_s": table,
        "ratios": ratios,
        "steps": _step_figures(runs),
        "identical": {key: f"{same}/{rows}" for key, (same, rows) in identical.items()},
        "acceptable": {key: f"{same}/{rows}" for key, (same, rows) in acceptable.items()},
        "prompts": len(runs[0].rows) if runs else 0,
        "repeats": max((len(values) for row in rates.values() for values in row.values()), default=0),
    }


def _step_figures(runs: Sequence[ArmRun]) -> dict[int, dict[str, dict[str, float]]]:
    """Per ``B`` and specdec arm (batched ones), the medians over repeats of :func:`step_split`'s figures:
    ``full_tokens_per_s`` (the full-batch steps' pace), ``tail_s`` and ``tail_share`` (of the run's seconds),
    and ``full_over_none``: the full-batch pace over ``none``'s in the same repeat (paired as the ratios)."""
    figures: dict[int, dict[str, dict[str, list[float]]]] = {}
    for r in runs:
        if r.split is None or r.arm.startswith(SINGLE):
            continue
        entry = figures.setdefault(r.batch_size, {}).setdefault(r.arm, {})
        full_s = r.split["full_s"]  # 0.0 when no step had every place busy: a pace of 0, kept so repeats stay paired
        entry.setdefault("full_tokens_per_s", []).append(r.split["full_tokens"] / full_s if full_s > 0 else 0.0)
        entry.setdefault("tail_s", []).append(r.split["tail_s"])
        entry.setdefault("tail_share", []).append(r.split["tail_s"] / r.seconds if r.seconds > 0 else 0.0)
    for row in figures.values():
        plain = row.get("none", {}).get("full_tokens_per_s")
        for arm, entry in row.items():
            if plain is None or arm == "none":
                continue
            pace = entry["full_tokens_per_s"]
            paired = [mine / theirs for mine, theirs in zip(pace, plain, strict=True) if theirs > 0]
            if paired:  # as summarize's ratios: the k-th runs of the two arms, which ran one after the other
                entry["full_over_none"] = paired
    return {batch: {arm: {key: round(float(np.median(values)), 3) for key, values in entry.items()}
                    for arm, entry in row.items()} for batch, row in figures.items()}  # fmt: skip


def format_summary(summary: dict[str, Any]) -> str:
    """Markdown: tokens/s by B and arm, then the ratios, then identity."""
    table = summary["tokens_per_s"]
    arms = list(dict.fromkeys(arm for row in table.values() for arm in row))
    rows = [[str(b), *(f"{table[b][a]:.1f}" if a in table[b] else "" for a in arms)] for b in table]
    lines = [markdown_table(["B", *(f"{a} tok/s" for a in arms)], rows)]
    names = list(dict.fromkeys(name for row in summary["ratios"].values() for name in row))
    if names:
        ratio_rows = [[str(b), *(f"{summary['ratios'][b][n]:.2f}x" if n in summary["ratios"][b] else ""
                                 for n in names)] for b in summary["ratios"]]  # fmt: skip
        lines += ["", markdown_table(["B", *names], ratio_rows)]
    steps = summary.get("steps") or {}
    step_arms = list(dict.fromkeys(arm for row in steps.values() for arm in row))
    if step_arms:
        def cell(entry: dict[str, float] | None) -> str:
            if entry is None:
                return ""
            over = f", {entry['full_over_none']:.2f}x none" if "full_over_none" in entry else ""
            return f"{entry['full_tokens_per_s']:.1f}{over}; tail {entry['tail_s']:.2f} s ({entry['tail_share']:.0%})"

        step_rows = [[str(b), *(cell(steps[b].get(a)) for a in step_arms)] for b in steps]
        lines += ["", "Full-batch steps (every place busy; prefills excluded) tok/s, and the tail (steps with fewer "
                  "rows, once no prompt is left to join):", "",
                  markdown_table(["B", *step_arms], step_rows)]  # fmt: skip
    bad = {k: v for k, v in summary["acceptable"].items() if v.split("/")[0] != v.split("/")[1]}
    lines.append(
        f"\n{summary['prompts']} prompts, median of {summary.get('repeats', 1)} run(s) per figure (a ratio: the median "
        "of the ratios within each repeat); rows identical "
        "to their single-sequence plain decoding: "
        + ", ".join(f"{k} {v}" for k, v in summary["identical"].items())
        + ("; every difference at a near-tie" if not bad else f"; NOT at a near-tie: {bad}")
    )
    return "\n".join(lines)


def plot(summary: dict[str, Any], path: str | Path, title: str) -> Path:
    """Tokens/s against batch size, one line per arm (``single:`` arms left out: they have one point)."""
    plt = pyplot()

    table = summary["tokens_per_s"]
    sizes = sorted(table)
    arms = [a for a in dict.fromkeys(a for row in table.values() for a in row) if not a.startswith(SINGLE)]
    figure, axes = plt.subplots(figsize=(6.0, 4.0))
    for arm in arms:
        points = [(b, table[b][arm]) for b in sizes if arm in table[b]]
        axes.plot([b for b, _ in points], [v for _, v in points], marker="o", label=arm)
    axes.set_xscale("log", base=2)
    axes.set_xticks(sizes, [str(b) for b in sizes])
    axes.set_xlabel("batch size B")
    axes.set_ylabel("aggregate tokens/s")
    axes.set_title(title, fontsize=8)
    axes.legend(fontsize=8)
    axes.grid(alpha=0.3)
    return save_figure(figure, path)
