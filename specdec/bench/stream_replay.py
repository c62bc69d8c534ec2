"""Drafters driven by a known token stream instead of a model: costs and acceptance, no forwards.

A **replay** pretends the target model would emit exactly ``stream`` after its first
``prompt_len`` tokens (teacher forcing). Each step the drafter proposes a tree rooted at
the pending token ``stream[i]``; the "model" choice at a node whose path from the root
spells ``stream[i : i + d + 1]`` is the stream's next token ``stream[i + d + 1]``, and
elsewhere a fixed pseudo-random token (:func:`off_path_choice`). The walk, the bonus and
the feedback then follow the same rules as the model's verifiers. :class:`ReplayVerifier`
implements the :class:`~specdec.types.Verifier` protocol, so :func:`replay` runs the
real loop, :func:`specdec.engine.decode`, with the real drafter, at a cost of microseconds
per step instead of a forward.

What it is for: timing a drafter's own work per step (propose + update) and the loop's
own overhead on realistic text and trees, and a machine-independent acceptance figure
for drafter changes. It is not the model's acceptance: a real model departs from any
fixed text.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from specdec.backends import make_verifier
from specdec.bench.methods import generator_options
from specdec.bench.report import OVERALL, markdown_table
from specdec.budget import AcceptanceModel, BudgetPlanner, CostTable, Throughput, VerifyCostModel
from specdec.budget.calibration_cache import cost_model
from specdec.coercion import resolve_store
from specdec.decoding import DecodingConfig, StopRules
from specdec.drafters import make_factory
from specdec.engine import decode
from specdec.errors import SpecDecError
from specdec.models import load_model
from specdec.types import (
    DEFAULT_KERNEL,
    Drafter,
    DraftTree,
    Feedback,
    GenerationResult,
    KernelChoice,
    TokenChooser,
    Verification,
    VerifierDescription,
)

_GOLDEN = 2654435761  # Knuth's multiplicative hash constant: spreads off-path choices over the vocabulary


def off_path_choice(token: int, depth: int, vocab_size: int) -> int:
    """The replayed model's choice after a node off the stream's path: fixed, arbitrary."""
    return (token * _GOLDEN + depth + 1) % vocab_size


def judge(tree: DraftTree, stream: Sequence[int], pending_index: int, vocab_size: int,
          topk: int) -> tuple[list[int], Feedback | None]:
    """The replayed verification of ``tree`` rooted at ``stream[pending_index]``.

    Returns the accepted node indices (root first) and, when ``topk > 0``, feedback whose
    row for node ``i`` starts with the replayed model's choice there, then ``choice + j``
    (mod vocabulary) for ranks ``j = 1 .. topk - 1``. O(N * topk) for N nodes.
    """
    if tree.tokens[0] != stream[pending_index]:
        raise SpecDecError(f"the tree's root {tree.tokens[0]} is not the pending token {stream[pending_index]}")
    on_path = [False] * tree.size  # node i spells stream[pending_index : pending_index + depth + 1]
    choices = [0] * tree.size
    for i in range(tree.size):
        depth = tree.depths[i]
        on_path[i] = (i == 0 or on_path[tree.parents[i]]) and tree.tokens[i] == stream[pending_index + depth]
        next_index = pending_index + depth + 1
        if on_path[i] and next_index < len(stream):
            choices[i] = int(stream[next_index])
        else:
            choices[i] = off_path_choice(tree.tokens[i], depth, vocab_size)
    path = list(tree.walk(choices))
    feedback = None
    if topk > 0:
        base = np.asarray(choices, dtype=np.int64)[:, None]  # [N, 1]
        ranks = np.arange(topk, dtype=np.int64)[None, :]  # [1, k]
        feedback = Feedback(np.asarray(tree.tokens, dtype=np.int64), (base + ranks) % vocab_size)  # [N, k]
    return path, feedback


@dataclass
class ReplayState:
    """The replayed verifier's per-sequence state: how many stream tokens are committed."""

    committed_len: int


class ReplayVerifier:
    """A :class:`~specdec.types.Verifier` whose "model" emits ``stream``: :func:`specdec.engine.decode` runs unchanged.

    It answers prefill and verify by the rule in the module docstring, so a decode over it
    is the real loop with the real drafter, and its output is ``stream`` after the prompt.
    ``context_length`` is the stream's length minus one, so no node is drafted past the
    last token whose successor is known. It runs no model: no kernels, no cost of its own
    (its identity names only itself).
    """

    name = "replay"
    device = torch.device("cpu")
    dtype = None
    max_tree_nodes: int | None = None  # no cap of its own (a static cache has one)
    buckets: tuple[int, ...] | None = None
    cache_kind = "replay"
    engine = "replay"
    kernels = KernelChoice()

    def __init__(self, stream: Sequence[int], vocab_size: int) -> None:
        if len(stream) < 2:
            raise SpecDecError(f"a replay needs a stream of at least 2 tokens, got {len(stream)}")
        self.stream = [int(t) for t in stream]
        self.vocab_size = vocab_size
        self.context_length = len(self.stream) - 1

    @property
    def description(self) -> VerifierDescription:
        return VerifierDescription(self.engine, self.name, self.device, self.dtype, self.vocab_size,
                                   self.context_length, self.max_tree_nodes)  # fmt: skip

    def identity(self) -> dict[str, str]:
        return {"backend": self.name, "cache": self.cache_kind}

    def weights_fingerprint(self) -> str:
        return "replay"

    def kernel_variants(self, rows: int) -> tuple[str, ...]:
        return (DEFAULT_KERNEL,)

    def use_kernels(self, choice: KernelChoice) -> None:
        """No model, no kernels: nothing to switch."""

    def rewind(self, state: ReplayState, committed_len: int) -> None:
        if not 0 <= committed_len <= state.committed_len:
            raise SpecDecError(f"cannot rewind {state.committed_len} committed tokens to {committed_len}")
        state.committed_len = committed_len

    def release(self, state: ReplayState) -> None:
        """Nothing is held per sequence."""

    def warm_up(self, max_tokens: int) -> None:
        """Nothing to compile."""

    def close(self) -> None:
        """Nothing held."""

    @contextmanager
    def preserving(self) -> Iterator[None]:
        yield  # every sequence's state is its own

    def prefill(
        self, prompt: Sequence[int], prompt_topk: int = 0, *, chooser: TokenChooser | None = None,
        repetition_penalty: float = 1.0, reserve: int = 0, features: bool = False,
    ) -> tuple[ReplayState, int, Feedback | None]:
        """The pending token after ``prompt`` (which must be the stream's beginning); the options are ignored
        (a replay has no model: it hands over no features)."""
        length = len(prompt)
        if not 1 <= length < len(self.stream) or list(prompt) != self.stream[:length]:
            raise SpecDecError(f"a replay's prompt must be the stream's first 1 to {len(self.stream) - 1} tokens")
        feedback = None
        if prompt_topk:
            choices = np.asarray(self.stream[1 : length + 1], dtype=np.int64)[:, None]  # [L, 1]
            ranks = np.arange(prompt_topk, dtype=np.int64)[None, :]  # [1, k]
            feedback = Feedback(np.asarray(prompt, dtype=np.int64), (choices + ranks) % self.vocab_size)
        return ReplayState(length), self.stream[length], feedback

    def verify(self, state: ReplayState, tree: DraftTree, topk: int = 0, features: bool = False) -> Verification:
        path, feedback = judge(tree, self.stream, state.committed_len, self.vocab_size, topk)
        state.committed_len += len(path)
        accepted = tuple(tree.tokens[i] for i in path)
        return Verification(tuple(path), accepted, self.stream[state.committed_len], feedback)


def replay(drafter: Drafter, stream: Sequence[int], prompt_len: int, *, vocab_size: int,
           max_nodes: int | None = None) -> GenerationResult:
    """Decode ``stream[prompt_len:]`` with ``drafter`` through :func:`specdec.engine.decode`, no model.

    The result's stats are the real loop's: ``mat``, ``steps``, ``draft_s`` (the drafter's
    propose + update), ``other_s`` (the loop's own time); ``verify_s`` is the replayed
    verification, microseconds. The output is ``stream[prompt_len:]``, checked.
    """
    if not 1 <= prompt_len < len(stream):
        raise SpecDecError(f"prompt_len must be in [1, {len(stream) - 1}] for a stream of {len(stream)}, "
                           f"got {prompt_len}")
    verifier = ReplayVerifier(stream, vocab_size)
    rules = StopRules(max_new_tokens=len(stream) - prompt_len)
    config = DecodingConfig(rules, max_nodes=max_nodes, prompt_feedback=drafter.feedback_topk > 0)
    result = decode(verifier, drafter, verifier.stream[:prompt_len], config)
    if result.tokens != verifier.stream[prompt_len:]:
        raise SpecDecError("the replayed output differs from the stream: the loop or the replay is wrong")
    return result


# -- replaying drafter specs over a benchmark run's recorded outputs ----------------------------

# Frozen verification cost tables (ms by nodes, at any context) that price replayed steps:
# ``reference`` the default model on this project's 2-core CPU (docs/budget.md; 128 nodes
# extrapolated from 32 -> 64), ``flat`` a synthetic accelerator where up to 64 nodes cost one
# plain step. ``calibrated`` (not here) is this machine's cached calibration of the model.
COST_SIZES = (1, 8, 16, 32, 64, 128)
COST_TABLES = {
    "reference": (53.0, 83.0, 102.0, 129.0, 190.0, 312.0),
    "flat": (10.0, 10.0, 10.0, 10.0, 10.0, 13.0),
}


@dataclass(frozen=True)
class Stream:
    """A recorded greedy output: the model emitted ``output`` after ``prompt``."""

    question_id: int
    category: str
    prompt: list[int]
    output: list[int]


def recorded_streams(results: dict[str, Any], label: str | None = None) -> list[Stream]:
    """Every turn's prompt and output of method ``label`` (default: the run's reference) in a results file.

    The run must have been made with ``--keep-outputs``; a greedy method's outputs are what
    the model emits, so replaying drafters over them gives their acceptance without the model.
    """
    label = label or results["reference"]
    if label not in {m["label"] for m in results["methods"]}:
        labels = ", ".join(m["label"] for m in results["methods"])
        raise SpecDecError(f"the run has no method {label!r}; it has {labels}")
    spec = next(m for m in results["methods"] if m["label"] == label)
    if any(k in spec["options"] for k in ("temperature", "do_sample", "top_k", "top_p")):
        raise SpecDecError(f"method {label!r} samples: a replay needs greedy outputs")
    streams = []
    for question in results["questions"]:
        record = question["runs"][label]
        if "outputs" not in record:
            raise SpecDecError("the run kept no outputs: make it with `specdec bench ... --keep-outputs`")
        for prompt, output in zip(record["prompts"], record["outputs"], strict=True):
            if len(output) >= 2:  # the prefill decides the first token: a replay needs a step
                streams.append(Stream(question["question_id"], question["category"], prompt, output))
    return streams


def cost_table(name: str, model_spec: str = "default") -> Any:
    """A frozen :class:`~specdec.budget.cost_model.VerifyCostModel`: a named table, or ``calibrated`` (this
    machine's)."""
    if name == "calibrated":
        model, _ = load_model(None if model_spec == "default" else model_spec)
        return VerifyCostModel(cost_model(make_verifier(model))[0].table, learn=False)
    if name not in COST_TABLES:
        raise SpecDecError(f"unknown cost table {name!r}: {', '.join([*COST_TABLES, 'calibrated'])}")
    row = tuple(ms / 1e3 for ms in COST_TABLES[name])
    return VerifyCostModel(CostTable(COST_SIZES, (1, 4096), (row, row), {"device": name}), learn=False)


REPLAY_MODES = ("stream", "request")


def replay_spec(spec: Any, streams: Sequence[Stream], context: Any, cost: Any, mode: str = "stream", *,
                model: Any = None, baseline: Any = None) -> list[dict[str, Any]]:
    """One drafter spec over every stream, in order: ``mode`` says what the streams share.

    - ``stream`` (as one :class:`~specdec.Generator` runs its requests, and as ``specdec
      bench`` runs a method across its questions): one drafter factory for all streams, so
      what it shares across sequences is shared: ``sam``'s store of earlier sequences (its
      ``store`` option: on by default), ``arctic:shared=true``'s cache. Each drafter is told
      when its sequence ends (``finish``), which is when ``sam`` adds it to the store.
    - ``request``: a fresh factory per stream (a fresh ``specdec.run`` per prompt): a
      drafter sees its own prompt and output only, whatever its options.

    The spec's ``budget`` (default ``auto``, as in a run; ``full`` is the drafter's whole
    tree) and ``max_nodes`` apply; the planner sees only the frozen ``cost`` and no
    overhead, so nothing depends on a clock, and its statistics are kept across the streams
    in both modes (as a Generator's). Every step is priced with ``cost``: ``run_s`` is the
    run's verification time, ``plain_s`` plain decoding's for the same tokens (their ratio
    is the modelled speedup). ``store=false`` (or a size) sets the store ``sam`` drafts
    from, as for a Generator. Drafters that learn from the model's predictions cannot be
    replayed, nor can options that need a model (sampling, a backend).

    ``model``: a verifier of the model that recorded the streams; a drafter that learns from the model's
    predictions (``recycling``) then decodes each stream's prompt on it in place of the replay, on its
    own feedback (the others are replayed still); the planner sees only ``cost`` all the same, and the
    output is the model's (the recording's, but where a near tie went the other way; ``decoded`` says
    which ran). ``baseline``: a second frozen cost, pricing plain decoding's tokens as ``baseline_s``
    (plain decoding on another verifier).
    """
    if mode not in REPLAY_MODES:
        raise SpecDecError(f"unknown replay mode {mode!r}: {', '.join(REPLAY_MODES)}")
    options = dict(spec.options)
    budget, max_nodes = options.pop("budget", "auto"), options.pop("max_nodes", None)
    store = options.pop("store", None)
    construction, generation = generator_options()
    needs_model = [name for name in options if name in construction | generation]  # in the spec's order
    if needs_model:
        raise SpecDecError(f"{spec.label}: option {needs_model[0]!r} needs the model; a replay has none")

    def new_factory() -> Any:  # what a Generator makes once: the drafter factory and its store
        stored = context if store is None else dataclasses.replace(context, store=resolve_store(store))
        return make_factory(spec.name, options, stored)

    factory = new_factory()
    learns = bool(factory.create().feedback_topk)
    if learns and model is None:
        raise SpecDecError(f"{spec.label}: drafter {spec.name!r} learns from the model's predictions, which a "
                           "replay does not have; measure it with the model (`specdec bench`)")
    model = model if learns else None
    acceptance, throughput = AcceptanceModel(), Throughput(fixed_overhead_s=0.0)  # shared across prompts
    rows = []
    for index, stream in enumerate(streams):
        if mode == "request" and index:
            factory = new_factory()
        verifier = ReplayVerifier([*stream.prompt, *stream.output], context.vocab_size) if model is None else model
        planner = BudgetPlanner(verifier, budget, acceptance, throughput, cost=cost)
        rules = StopRules(len(stream.output), frozenset(context.eos_token_ids))
        drafter = factory.create()
        result = decode(verifier, drafter, stream.prompt, DecodingConfig(rules, max_nodes=max_nodes), planner=planner)
        finish = getattr(drafter, "finish", None)  # as Generator.generate: the sequence ended
        if finish is not None:
            finish()
        if model is None and result.tokens != stream.output:
            raise SpecDecError(f"the replay of question {stream.question_id} diverged: the loop or the replay is wrong")
        run_s, plain_s, baseline_s, committed = 0.0, 0.0, 0.0, len(stream.prompt)
        one = np.ones(1, dtype=np.int64)
        for record in result.stats.records:
            run_s += float(cost.calibrated(np.array([record.tree_size]), committed)[0])
            plain_s += float(cost.calibrated(one, committed)[0]) * (record.accepted + 1)
            if baseline is not None:
                baseline_s += float(baseline.calibrated(one, committed)[0]) * (record.accepted + 1)
            committed += record.accepted + 1
        rows.append({"label": spec.label, "mode": mode, "question_id": stream.question_id,
                     "category": stream.category, "steps": result.stats.steps, "emitted": result.stats.emitted_by_steps,
                     "nodes": sum(r.tree_size for r in result.stats.records), "run_s": run_s, "plain_s": plain_s,
                     "decoded": "replay" if model is None else "model",
                     **({} if baseline is None else {"baseline_s": baseline_s})})
    return rows


def replay_table(rows: Sequence[dict[str, Any]]) -> str:
    """Per method, mode and category, pooled: modelled speedup, MAT and nodes verified per step.

    Pooled: a category's MAT is all its tokens emitted by steps over all its steps (not a
    mean of per-question MATs), and its nodes per step likewise.
    """
    methods = list(dict.fromkeys((r["label"], r.get("mode", "stream")) for r in rows))
    categories = [*dict.fromkeys(r["category"] for r in rows), OVERALL]

    def cell(method: tuple[str, str], category: str) -> str:
        chosen = [r for r in rows if (r["label"], r.get("mode", "stream")) == method
                  and category in (OVERALL, r["category"])]
        steps = max(1, sum(r["steps"] for r in chosen))
        return (f"{sum(r['plain_s'] for r in chosen) / sum(r['run_s'] for r in chosen):.2f}x, "
                f"{sum(r['emitted'] for r in chosen) / steps:.2f}, {sum(r['nodes'] for r in chosen) / steps:.1f}")

    return markdown_table(["method", "mode", *categories],
                          [[label, mode, *[cell((label, mode), c) for c in categories]] for label, mode in methods])
