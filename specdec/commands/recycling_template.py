"""``specdec recycling-template``: calibrate a Token Recycling tree template on a target model.

1. **Acceptance rates.** Decode calibration prompts with the ``recycling`` drafter on a
   broad *calibration template* (a full fan of ranks under every node of the rank-0
   spine, deep), verifying every node (``budget="full"``), and count at every step, for
   each child of an accepted node, whether it was accepted (:class:`AcceptanceCounts`):
   the per-(depth, rank) rates ``a[d][j]``.
2. **The template.** :func:`~specdec.drafters.recycling_templates.grow_template` orders nodes by
   expected acceptance under those rates, best first, so every prefix is the best tree
   of its size under the model; how many of them a step verifies is the node budget's
   business (``max_nodes``, or the cost-aware planner of :mod:`specdec.budget`).

The counts are saved in the template (``meta``), so ``--recount`` regrows a template
from them without the model. The calibration template is broader than the templates it
produces, so every verified step writes more rows to the matrix than a small deployed
tree would: measured rates are slightly optimistic for small trees. Rates are conditional
on a node being drafted at all: a cold matrix (a token with no row yet) drafts fewer
nodes, which the rates do not see, so the MAT a template reaches is below
``expected_tokens_per_step`` early in a sequence.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from specdec.api import run
from specdec.bench.questions import load_questions
from specdec.commands.arguments import add_model_argument
from specdec.drafters.recycling import RecyclingConfig, RecyclingDrafter
from specdec.drafters.recycling_templates import AcceptanceCounts, TreeTemplate, grow_template
from specdec.errors import SpecDecError
from specdec.models import encode_prompt, load_model
from specdec.types import DraftTree, Feedback

# Rank prior for the calibration template: rank j is tried about as if accepted 0.6 * 0.6**j.
CALIBRATION_PRIOR = 0.6


def calibration_template(num_nodes: int = 100, max_depth: int = 8, k: int = 8) -> TreeTemplate:
    """A broad template to measure with: a full fan of ``k`` ranks under every node of the rank-0 spine.

    Accepted paths mostly follow rank 0, so fans along that spine offer every (depth, rank)
    pair at almost every step that reaches its depth. Nodes left in the budget go to the
    shape a geometric rank prior grows (rank ``j`` valued ``0.6 * 0.6**j`` at every depth).
    Listed by depth, then rank path.
    """
    chosen = {(0,) * d + (j,) for d in range(max_depth) for j in range(k)}
    if num_nodes - 1 < len(chosen):
        raise SpecDecError(f"a calibration template of depth {max_depth} needs {len(chosen) + 1} nodes at least")
    ranks = CALIBRATION_PRIOR * CALIBRATION_PRIOR ** np.arange(k, dtype=np.float64)
    for path in grow_template(np.tile(ranks, (max_depth, 1)), 10 * num_nodes).paths:
        if len(chosen) == num_nodes - 1:
            break
        if path[:-1] == () or path[:-1] in chosen:
            chosen.add(path)
    return TreeTemplate(tuple(sorted(chosen, key=lambda p: (len(p), p))), f"calibration-{num_nodes}")


class CountingDrafter:
    """A recycling drafter that also counts per-(depth, rank) acceptance of what it proposed."""

    name = "recycling"

    def __init__(self, inner: RecyclingDrafter, counts: AcceptanceCounts) -> None:
        self.inner = inner
        self.counts = counts
        self.feedback_topk = inner.feedback_topk
        self._tree: DraftTree | None = None

    def reset(self, prompt: Sequence[int], feedback: Feedback | None = None) -> None:
        self.inner.reset(prompt, feedback)

    def propose(self, pending: int, max_nodes: int) -> DraftTree:
        self._tree = self.inner.propose(pending, max_nodes)
        return self._tree

    def update(self, accepted: Sequence[int], feedback: Feedback | None) -> None:
        tree = self._tree
        # A tree the engine pruned (near max_new_tokens) no longer matches the template nodes: skip it.
        if tree is not None and feedback is not None and len(feedback.tokens) == tree.size:
            self.counts.record(self.inner.template, self.inner.last_nodes, tree.parents, feedback.accepted_nodes)
        self.inner.update(accepted, feedback)


def measure_acceptance(
    model: Any,
    prompts: Sequence[Sequence[int]],
    template: TreeTemplate,
    *,
    k: int = 8,
    max_new_tokens: int = 128,
    reuse: bool = False,
    prompt_feedback: bool = False,
    progress: Callable[[int, Any], None] | None = None,
) -> AcceptanceCounts:
    """Decode ``prompts`` with ``recycling`` on ``template`` and count per-(depth, rank) acceptance.

    ``reuse`` keeps one matrix across prompts (a reused drafter object); otherwise each
    prompt starts cold, as a drafter named by a string does. ``progress(i, result)`` is
    called after each prompt.
    """
    counts = AcceptanceCounts(template.max_depth, k)
    config = RecyclingConfig(k=k, template=template, num_nodes=template.size)
    shared = RecyclingDrafter(config, template=template)
    for i, prompt in enumerate(prompts):
        inner = shared if reuse else RecyclingDrafter(config, template=template)
        # budget="full": every node of the template is verified, whatever a budget planner would cut.
        result = run(
            model, list(prompt), CountingDrafter(inner, counts), max_new_tokens=max_new_tokens,
            prompt_feedback=prompt_feedback, budget="full",
        )
        if progress is not None:
            progress(i, result)
    return counts


def calibration_prompts(questions: Path, per_category: int, tokenizer: Any) -> list[list[int]]:
    """First turns of Spec-Bench questions held out from evaluation, chat-templated.

    Within each category, questions ``5, 21, 37, ...`` (every 16th from the 6th) are
    taken: disjoint from the evenly spaced subsets ``specdec bench --per-category N``
    evaluates for ``N <= 10`` (which take multiples of 16 and of 8).
    """
    by_category: dict[str, list[str]] = {}
    for question in load_questions(questions):
        by_category.setdefault(question.category, []).append(question.turns[0])
    return [
        encode_prompt(tokenizer, group[5 + 16 * j])
        for group in by_category.values()
        for j in range(per_category)
        if 5 + 16 * j < len(group)
    ]


def counts_from_meta(meta: dict[str, Any]) -> AcceptanceCounts:
    """The acceptance counts a template recorded when it was calibrated."""
    offered, accepted = np.asarray(meta["offered"], dtype=np.int64), np.asarray(meta["accepted"], dtype=np.int64)
    if offered.shape != accepted.shape or offered.ndim != 2:
        raise SpecDecError(f"template meta holds offered {offered.shape} and accepted {accepted.shape} counts")
    counts = AcceptanceCounts(*offered.shape)
    counts.offered[:], counts.accepted[:] = offered, accepted
    counts.steps = int(meta.get("calibration_steps", 0))
    return counts


def build_template(counts: AcceptanceCounts, num_nodes: int, name: str, min_offered: int,
                   meta: dict[str, Any]) -> TreeTemplate:
    """Grow the template the counts' rates call for; the counts, rates and expected tokens go in ``meta``."""
    rates = counts.rates(min_offered)
    meta = {
        **meta,
        "calibration_steps": counts.steps,
        "min_offered": min_offered,
        "rates": np.round(rates, 6).tolist(),
        "offered": counts.offered.tolist(),
        "accepted": counts.accepted.tolist(),
    }
    template = grow_template(np.round(rates, 6), num_nodes, name, meta=meta)
    template.meta["expected_tokens_per_step"] = {
        str(n): round(1.0 + template.expected_accepted(n), 3) for n in (2, 4, 8, 16, 32, 48, 64, 81)
        if n <= template.size
    }
    return template


def cmd_recycling_template(args: argparse.Namespace) -> int:
    if not args.out:
        raise SpecDecError("--out FILE is required (the template JSON to write)")
    command = "specdec recycling-template " + " ".join(sys.argv[2:])
    if args.recount:
        source = TreeTemplate.load(args.recount)
        counts = counts_from_meta(source.meta)
        meta = {key: value for key, value in source.meta.items() if key not in ("rates", "expected_tokens_per_step")}
        meta["recounted_by"] = command
    else:
        model, tokenizer = load_model(None if args.model == "default" else args.model)
        prompts = calibration_prompts(Path(args.questions), args.per_category, tokenizer)
        probe = calibration_template(args.calibration_nodes, args.max_depth, args.k)
        print(f"calibrating on {len(prompts)} prompts with a {probe.size}-node template "
              f"(levels {probe.level_counts()})", file=sys.stderr)

        def tick(i: int, result: Any) -> None:
            print(f"  prompt {i + 1}/{len(prompts)}: MAT {result.stats.mat:.2f}", file=sys.stderr)

        counts = measure_acceptance(
            model, prompts, probe, k=args.k, max_new_tokens=args.max_new_tokens, progress=tick
        )
        meta = {
            "model": args.model,
            "command": command,
            "calibration_prompts": len(prompts),
            "calibration_max_new_tokens": args.max_new_tokens,
            "calibration_template_nodes": probe.size,
        }
    template = build_template(counts, args.nodes, args.name, args.min_offered, meta)
    template.save(args.out)
    print(f"wrote {args.out}: {template.size} nodes, levels {template.level_counts()}, expected tokens per step "
          f"{template.meta['expected_tokens_per_step']}", file=sys.stderr)
    return 0


def register(sub: Any) -> None:
    """Add ``specdec recycling-template`` to the command line."""
    parser = sub.add_parser(
        "recycling-template", help="measure per-(depth, rank) acceptance and write a Token Recycling tree template"
    )
    parser.add_argument("--out", default=None, help="the template JSON to write")
    add_model_argument(parser)
    parser.add_argument("--questions", default="../shared/data/spec_bench/question.jsonl")
    parser.add_argument("--per-category", type=int, default=2, help="calibration questions per category")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--calibration-nodes", type=int, default=80, help="size of the broad template measured with")
    parser.add_argument("--max-depth", type=int, default=8)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--nodes", type=int, default=81, help="nodes in the written template (root included)")
    parser.add_argument("--min-offered", type=int, default=20)
    parser.add_argument("--name", default="smollm2-135m-instruct")
    parser.add_argument("--recount", default=None, metavar="TEMPLATE",
                        help="no model run: regrow a template from the counts another template recorded")
    parser.set_defaults(func=cmd_recycling_template)
