"""Deterministic quality figures: MAT and steps of every drafter on fixed prompts.

Greedy decoding on a fixed prompt is deterministic, and so is what a drafter proposes
along the way, so MAT and the number of target forwards do not move with machine noise:
they are the figures a regression check can hold to a saved value. (Wall times do
move; pytest-benchmark compares those, see ``docs/benchmarks.md``.)

The suite is every registered drafter but ``none`` plus the featured composites whose
parts are registered, each with its default options and a fixed budget of 16 nodes per
step (the planner's ``auto`` budget learns from measured costs, which differ between
machines). Drafters that need a datastore (REST) get one built
over GSM8K's training problems (``../shared/data``), or are left out, and said to be,
where that corpus is absent.

Refresh the saved values after a deliberate change (see ``docs/benchmarks.md``)::

    specdec bench quality --write tests/data/quality_baseline.json
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import transformers

from specdec.bench.corpora import build_datastore, gsm8k_documents
from specdec.bench.methods import ForwardMeter, build_methods, drafter_context, parse_methods
from specdec.drafters import MODEL_DRAFTERS, available_drafters, make_factory
from specdec.errors import SpecDecError
from specdec.models import encode_prompt
from specdec.testing import compare_outputs

MAX_NEW_TOKENS = 32
# Nodes each step verifies: a fixed budget does not depend on timings (the planner's ``auto``
# learns from measured costs, which differ between machines) and 16 nodes keep the check near
# a minute of CPU. (The kernels do: calibration may pick specdec's CPU kernels on one machine
# and not another; their rounding can flip a near-tie, which TOLERANCE covers.)
BUDGET = 16
# Relative MAT drop that fails the check: well above the drift a near-tie flip on another
# CPU can cause on these prompts, well below what a worse drafter setting costs.
TOLERANCE = 0.03
# Composites worth guarding, when both parts are registered.
FEATURED_COMPOSITES = ("sam+recycling",)
REFRESH = "specdec bench quality --write tests/data/quality_baseline.json"
PLAIN = "hf-generate"  # the reference every drafter's output is checked against: plain greedy decoding

PROMPTS: dict[str, str] = {
    "code_edit": (
        "Here is a Python function:\n\n"
        "def count_words(text, min_length):\n"
        "    counts = {}\n"
        "    for word in text.split():\n"
        "        word = word.strip('.,;:!?').lower()\n"
        "        if len(word) < min_length:\n"
        "            continue\n"
        "        counts[word] = counts.get(word, 0) + 1\n"
        "    return counts\n\n"
        "Rename the function to `word_histogram` and the argument `text` to `document`. "
        "Reply with the whole updated function only."
    ),
    "summarize": (
        "Summarize the following report in three sentences.\n\n"
        "The city council met on Tuesday to review the water utility's annual report. The utility "
        "replaced 14 kilometres of cast-iron mains, which cut leaks by a fifth compared with last year. "
        "Average household bills rose by 4 percent, mostly because of higher electricity prices at the "
        "pumping stations. The council approved a plan to install smart meters in 12,000 homes over the "
        "next two years, paid for by a state grant. Residents who spoke at the meeting asked for clearer "
        "bills and for advance notice of planned outages; the utility agreed to send text alerts at "
        "least 48 hours before any planned outage."
    ),
    "math": (
        "A bakery sells muffins for $3 each and cookies for $1.50 each. On Monday it sold 40 muffins and "
        "twice as many cookies. How much money did the bakery make on Monday? Explain step by step."
    ),
}


def suite(context: Any, datastores: Mapping[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """``(specs, left_out)``: registered drafters and featured composites, labelled by name.

    Each spec runs the drafter with its default options and a fixed budget of
    :data:`BUDGET` nodes. ``context`` is the target's :class:`~specdec.drafters.DrafterContext`. A
    drafter that cannot be built without a datastore gets ``datastores[name]`` (a datastore
    of the kind named like it), or is left out (``left_out[name]``: the reason) when there
    is none; any other error building one is raised.
    """
    datastores = datastores or {}
    names = [n for n in available_drafters() if n != "none" and n not in MODEL_DRAFTERS]
    names += [c for c in FEATURED_COMPOSITES if all(p in names for p in c.split("+"))]
    specs, left_out = [], {}
    for name in names:
        options = f":budget={BUDGET}"
        try:
            make_factory(name, {}, context)
        except SpecDecError as error:
            if "datastore" not in str(error):
                raise
            if name not in datastores:
                left_out[name] = "no corpus for its datastore (GSM8K's training problems, ../shared/data)"
                continue
            options += f":datastore={datastores[name]}"
        specs.append(f"{name}={name}{options}")
    if "arctic" not in names:
        left_out["arctic"] = "not registered here: Arctic Inference (a peer) is not installed"
    for name in MODEL_DRAFTERS:
        left_out[name] = "needs the target model/draft model"
    return specs, left_out


def build_datastores(tokenizer: Any, corpus: str | os.PathLike[str], directory: str | os.PathLike[str],
                     kinds: Sequence[str] = ("rest",), max_tokens: int = 400_000) -> dict[str, str]:
    """Datastores of ``kinds`` over the first ``max_tokens`` of a GSM8K-style jsonl corpus.

    GSM8K's training problems (``question`` and ``answer`` fields), the team's shared corpus:
    the same file and cut give the same datastore, hence the same figures, on every machine.
    """
    documents = gsm8k_documents(tokenizer, max_tokens, corpus)
    paths = {}
    for kind in kinds:
        paths[kind] = str(Path(directory) / f"quality.{kind}")
        build_datastore(kind, documents, paths[kind], tokenizer)
    return paths


def measure(model: Any, tokenizer: Any, specs: Sequence[str], *, prompts: Mapping[str, str] = PROMPTS,
            max_new_tokens: int = MAX_NEW_TOKENS) -> dict[str, Any]:
    """``{label: {"mat", "steps", "prompts": {name: {...}}}}`` for every spec.

    Every output is also checked against plain decoding's (``model.generate``, greedy: the
    ``hf-generate`` peer) by :func:`specdec.testing.compare_outputs`: a figure measured on a
    wrong output would be no guard at all.
    """
    meter = ForwardMeter(model)
    try:
        plain, *methods = build_methods(parse_methods([PLAIN, *specs]), model, tokenizer, meter)
        encoded = {name: encode_prompt(tokenizer, text) for name, text in prompts.items()}
        reference = {name: plain.generate(ids, max_new_tokens).tokens for name, ids in encoded.items()}
        figures: dict[str, Any] = {}
        for method in methods:
            per_prompt: dict[str, Any] = {}
            for name, ids in encoded.items():
                measurement = method.generate(ids, max_new_tokens)
                comparison = compare_outputs(model, ids, measurement.tokens, reference[name])
                if not comparison.acceptable:
                    raise SpecDecError(f"{method.spec.label} on prompt {name!r}, against plain decoding ({PLAIN}): "
                                       f"{comparison.describe()}")
                per_prompt[name] = {"mat": round(measurement.emitted_by_steps / max(1, measurement.steps), 4),
                                    "steps": measurement.steps, "emitted": measurement.emitted_by_steps,
                                    "new_tokens": measurement.new_tokens}
            steps = sum(p["steps"] for p in per_prompt.values())
            emitted = sum(p["emitted"] for p in per_prompt.values())
            figures[method.spec.label] = {"mat": round(emitted / max(1, steps), 4), "steps": steps,
                                          "prompts": per_prompt}
    finally:
        meter.close()
    return figures


def check(measured: Mapping[str, Any], saved: Mapping[str, Any], tolerance: float = TOLERANCE,
          left_out: Mapping[str, str] | None = None) -> list[str]:
    """Problems with ``measured`` against ``saved`` (empty: all is well).

    A drafter fails when, on any prompt, its MAT fell by more than ``tolerance`` (relative)
    or its steps rose by more than that, or a saved prompt was not measured; a drafter with
    no saved figures fails too, so a new drafter is guarded from the day it lands (refresh
    the file to add it); and so does a saved drafter that was not measured, unless
    ``left_out`` gives the reason (:func:`not_measured` says them).
    """
    left_out = left_out or {}
    problems = []
    for label in saved:
        if label not in measured and label not in left_out:
            problems.append(f"{label}: saved but not measured, and no reason given")
    for label, figures in measured.items():
        if label not in saved:
            problems.append(f"{label}: no saved figures; refresh them with `{REFRESH}`")
            continue
        before = saved[label]["prompts"]
        worse = []
        for name, was in before.items():
            now = figures["prompts"].get(name)
            if now is None:
                worse.append(f"{name} not measured")
            elif now["mat"] < was["mat"] * (1 - tolerance) or now["steps"] > was["steps"] * (1 + tolerance):
                worse.append(f"{name} MAT {now['mat']:.3f} in {now['steps']} steps (saved {was['mat']:.3f} in "
                             f"{was['steps']})")
        if worse:
            problems.append(f"{label} (tolerance {tolerance:.0%} per prompt): " + "; ".join(worse))
    return problems


def not_measured(saved: Mapping[str, Any], measured: Mapping[str, Any], left_out: Mapping[str, str]) -> list[str]:
    """Saved drafters this run did not measure, each with its reason."""
    return [f"{label}: {left_out.get(label, 'no reason given')}" for label in saved if label not in measured]


def improvements(measured: Mapping[str, Any], saved: Mapping[str, Any], tolerance: float = TOLERANCE) -> list[str]:
    """Drafters whose MAT rose past the tolerance: worth a refresh, so the guard holds the new level."""
    return [
        f"{label}: MAT {figures['mat']:.3f}, saved {saved[label]['mat']:.3f}"
        for label, figures in measured.items()
        if label in saved and figures["mat"] > saved[label]["mat"] * (1 + tolerance)
    ]


def load_saved(path: str | os.PathLike[str]) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(path).read_text(encoding="utf-8"))
    return data


def measure_suite(model: Any, tokenizer: Any, corpus: Path, drafters: Sequence[str] | None = None) -> tuple[
        dict[str, Any], dict[str, str]]:
    """``(figures, left out)``: :func:`measure` over ``drafters`` (default: :func:`suite`), datastores over ``corpus``.

    The datastores are built in a temporary directory (when ``corpus`` exists) and removed
    after; the suite's drafters that need one are left out, with the reason, where it does not.
    """
    with tempfile.TemporaryDirectory() as directory:
        datastores = build_datastores(tokenizer, corpus, directory) if corpus.is_file() else {}
        left_out: dict[str, str] = {}
        if drafters:
            specs = list(drafters)
        else:
            specs, left_out = suite(drafter_context(model, tokenizer), datastores)
        return measure(model, tokenizer, specs), left_out


def baseline_document(figures: Mapping[str, Any]) -> dict[str, Any]:
    """What ``--write`` saves: the figures and the settings and versions they were measured with."""
    return {
        "about": "MAT and steps of each drafter on specdec.bench.quality.PROMPTS, checked by "
                 f"tests/test_quality.py. Refresh: {REFRESH}",
        "max_new_tokens": MAX_NEW_TOKENS,
        "budget": BUDGET,
        "tolerance": TOLERANCE,
        "measured_with": {"torch": torch.__version__, "transformers": transformers.__version__},
        "drafters": dict(figures),
    }
