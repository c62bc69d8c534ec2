"""Composite drafters ``"A+B"``: a retrieval drafter A with an auxiliary drafter B.

SAM-Decoding (Hu et al., *SAM Decoding: Speculative Decoding via Suffix Automaton*, 2024)
pairs its suffix-automaton chain with an auxiliary drafter (Token Recycling in its
headline result) by **Algorithm 2**: let ``m`` be the retrieval drafter's match length
(for SAM, ``max(m_d, m_s - l_bias)``); if ``m >= l_threshold`` the step verifies the
retrieval chain, otherwise the auxiliary drafter's tree. A long match predicts a long
accepted chain; a short one predicts little, and the auxiliary tree does better.

Two modes:

- ``either`` (the paper's Algorithm 2): one source per step, chosen as above.
- ``merge`` (new here; the default of ``sam+recycling``): both drafts in one tree, the
  retrieval drafter's tree (``sam``'s occurrence tree, ``pld``'s chain) grafted onto the
  auxiliary tree, prefixes they share verified once, so one forward verifies both and the
  composite accepts at least what either part would on the same step. Order, which
  decides what a node budget cuts: when the merged tree is larger than the step's
  ``max_nodes`` and the caller's budget planner lends its acceptance model
  (``DrafterContext.acceptance``), nodes are ordered by the acceptance it expects of each
  (learned per source, feature, depth and rank); otherwise a trusted retrieval draft
  (``m >= l_threshold``) comes before the auxiliary nodes, an untrusted one after them.
  Under ``budget="auto"`` the planner picks nodes by the same estimates whatever the order.

**Attribution.** A step's ``DraftTree.source`` names its source (A's or B's name, or the
composite's name for a merged tree); a merged tree also labels every node
(``node_sources``): ``"A"``, ``"B"``, or ``"A&B"`` for a node both proposed. The engine
records the labels of each step's accepted nodes, and ``GenerationStats.accepted_by_source``
credits each accepted token to its label (``steps_by_source`` counts steps per source).

``l_threshold`` defaults to the paper's 5 for SAM; other retrieval drafters report match
lengths on other scales (PLD's is its n-gram length, at most ``max_ngram = 3``), so their
defaults are in :data:`DEFAULT_THRESHOLDS`, measured (docs/algorithms/recycling.md).

Costs: the parts' own plus O(N) to graft an ``N``-node merged tree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specdec.budget.acceptance import node_keys
from specdec.drafters.base import DrafterContext, Factory
from specdec.errors import SpecDecError
from specdec.types import Drafter, DrafterFactory, DraftTree, Feedback, RetrievalDrafter

MODES = ("either", "merge")
# l_threshold by retrieval drafter: SAM's is the paper's; PLD's match length is an n-gram length (1..3).
DEFAULT_THRESHOLDS = {"sam": 5, "pld": 2}
PAPER_THRESHOLD = 5
# The mode by retrieval drafter: sam's occurrence tree merges (measured, docs/algorithms/sam.md); others choose.
DEFAULT_MODES = {"sam": "merge"}

Builder = Callable[[Mapping[str, Any], DrafterContext], DrafterFactory]


@dataclass(frozen=True)
class CompositeConfig:
    """``mode``: ``"either"`` (Algorithm 2) or ``"merge"`` (None: by drafter, :data:`DEFAULT_MODES`,
    else ``"either"``); ``threshold``: l_threshold (None: by drafter)."""

    mode: str | None = None
    threshold: int | None = None

    def __post_init__(self) -> None:
        if self.mode is not None and self.mode not in MODES:
            raise SpecDecError(f"composite drafter: mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.threshold is not None and (
            isinstance(self.threshold, bool) or not isinstance(self.threshold, int) or self.threshold < 0
        ):
            raise SpecDecError(f"composite drafter: threshold must be an int >= 0, got {self.threshold!r}")


def merge_trees(
    retrieved: DraftTree, auxiliary: DraftTree, labels: tuple[str, str], source: str, retrieved_first: bool = True
) -> DraftTree:
    """One tree holding every path of ``retrieved`` and of ``auxiliary`` (same root).

    The nodes of the tree listed first (``retrieved`` unless ``retrieved_first`` is False)
    keep their order and come first; the other tree's nodes follow, those whose path
    already exists shared rather than repeated, so siblings stay distinct. ``labels`` name
    the two sources; each node is labelled by who proposed it: ``labels[0]``,
    ``labels[1]`` or ``"labels[0]&labels[1]"``; a part that labels its own nodes (``sam``:
    ``sam-dynamic``, ``sam-store``) keeps its labels in place of its name. A node keeps the
    feature its first proposer gave it (the retrieval drafter's, when both did). O(N) for N
    nodes in all.

    >>> t = merge_trees(DraftTree.chain(1, [2, 3]), DraftTree((1, 2, 4), (-1, 0, 1)), ("sam", "rec"), "x")
    >>> t.tokens, t.parents, t.node_sources
    ((1, 2, 3, 4), (-1, 0, 1, 1), ('sam&rec', 'sam&rec', 'sam', 'rec'))
    """
    if retrieved.tokens[0] != auxiliary.tokens[0]:
        raise SpecDecError(f"merged trees need one root, got tokens {retrieved.tokens[0]} and {auxiliary.tokens[0]}")
    tokens, parents = [retrieved.tokens[0]], [-1]
    names: list[list[str]] = [["", ""]]  # per merged node: its label from each part ("": not proposed by it)
    features: list[int] = [-1]
    children: list[dict[int, int]] = [{}]
    order = ((retrieved, 0), (auxiliary, 1)) if retrieved_first else ((auxiliary, 1), (retrieved, 0))
    for tree, part in order:
        own = tree.node_sources
        tree_features = tree.node_features
        where = [0] * tree.size  # tree node -> merged node
        for i in range(tree.size):
            if i == 0:
                node = 0
            else:
                parent, token = where[tree.parents[i]], tree.tokens[i]
                node = children[parent].get(token, -1)
                if node < 0:
                    node = len(tokens)
                    tokens.append(token)
                    parents.append(parent)
                    names.append(["", ""])
                    features.append(-1)
                    children.append({})
                    children[parent][token] = node
            names[node][part] = own[i] if own is not None else labels[part]
            if features[node] < 0 and tree_features is not None:
                features[node] = tree_features[i]
            where[i] = node
    node_sources = tuple("&".join(name for name in pair if name) for pair in names)
    node_features = tuple(max(f, 0) for f in features) if max(features) >= 0 else None
    return DraftTree(tuple(tokens), tuple(parents), source, node_sources, node_features)


def order_by_acceptance(tree: DraftTree, acceptance: Any) -> DraftTree:
    """``tree`` with its nodes in the order of the acceptance ``acceptance`` expects of each.

    ``acceptance`` is an :class:`~specdec.budget.acceptance.AcceptanceModel`; its ``p`` never
    grows from a parent to its child, so sorting by ``p`` (ties: the old order) keeps
    parents first, and every prefix is the best tree of its size under the model. O(N log N).
    """
    _, p = acceptance.estimate(tree, node_keys(tree))
    order = sorted(range(tree.size), key=lambda i: (-float(p[i]), i))
    position = {old: new for new, old in enumerate(order)}
    sources, features = tree.node_sources, tree.node_features
    return DraftTree(
        tuple(tree.tokens[i] for i in order),
        tuple(-1 if i == 0 else position[tree.parents[i]] for i in order),
        tree.source,
        None if sources is None else tuple(sources[i] for i in order),
        None if features is None else tuple(features[i] for i in order),
    )


def _part_feedback(feedback: Feedback | None, part: Drafter) -> Feedback | None:
    """The feedback ``part`` asked for: none, or the first ``feedback_topk`` ids per row (a view, no copy), with
    the features where it reads them (``feedback_features``)."""
    k, features = part.feedback_topk, bool(getattr(part, "feedback_features", False))
    if feedback is None or (k == 0 and not features):
        return None
    if feedback.topk.shape[1] == k and (features or feedback.features is None):
        return feedback
    return Feedback(feedback.tokens, feedback.topk[:, :k], feedback.accepted_nodes,
                    feedback.features if features else None)  # fmt: skip


class CompositeDrafter:
    """Algorithm 2 (``either``) or one merged tree (``merge``) from a retrieval and an auxiliary drafter."""

    def __init__(self, retrieval: RetrievalDrafter, auxiliary: Drafter, config: CompositeConfig | None = None,
                 acceptance: Any = None) -> None:
        self.config = config or CompositeConfig()
        self.retrieval = retrieval
        self.auxiliary = auxiliary
        self.acceptance = acceptance  # the caller's AcceptanceModel (orders merged trees a budget cuts), or None
        self.name = f"{retrieval.name}+{auxiliary.name}"
        threshold = self.config.threshold
        self.threshold = threshold if threshold is not None else DEFAULT_THRESHOLDS.get(retrieval.name, PAPER_THRESHOLD)
        self.mode = self.config.mode or DEFAULT_MODES.get(retrieval.name, "either")
        self.feedback_topk = max(retrieval.feedback_topk, auxiliary.feedback_topk)
        self.feedback_features = any(getattr(part, "feedback_features", False) for part in (retrieval, auxiliary))

    def reset(self, prompt: Sequence[int], feedback: Feedback | None = None) -> None:
        self.retrieval.reset(prompt, _part_feedback(feedback, self.retrieval))
        self.auxiliary.reset(prompt, _part_feedback(feedback, self.auxiliary))

    def propose(self, pending: int, max_nodes: int) -> DraftTree:
        retrieved = self.retrieval.propose(pending, max_nodes)
        trusted = retrieved.size > 1 and self.retrieval.match_length() >= self.threshold
        if self.mode == "either":
            return retrieved if trusted else self.auxiliary.propose(pending, max_nodes)
        tree = self.auxiliary.propose(pending, max_nodes)
        if retrieved.size == 1:
            return tree
        if tree.size == 1:
            return retrieved
        labels = (self.retrieval.name, self.auxiliary.name)
        merged = merge_trees(retrieved, tree, labels, self.name, retrieved_first=trusted)
        if merged.size > max_nodes and self.acceptance is not None:
            merged = order_by_acceptance(merged, self.acceptance)
        return merged.prefix(max_nodes)

    def update(self, accepted: Sequence[int], feedback: Feedback | None) -> None:
        self.retrieval.update(accepted, _part_feedback(feedback, self.retrieval))
        self.auxiliary.update(accepted, _part_feedback(feedback, self.auxiliary))

    def finish(self) -> None:
        """The sequence ended: tell the parts that keep state across sequences (``sam``'s store)."""
        for part in (self.retrieval, self.auxiliary):
            finish = getattr(part, "finish", None)
            if callable(finish):
                finish()


def composite_factory(
    name: str, options: Mapping[str, Any], context: DrafterContext, registry: Mapping[str, Builder]
) -> DrafterFactory:
    """The factory of composite ``"A+B"``: A a registered retrieval drafter, B any registered drafter.

    ``options`` holds the composite's own (``mode``, ``threshold``) and each part's, either
    under the part's name or dotted: ``{"mode": "merge", "recycling": {"num_nodes": 16}}``
    or ``{"mode": "merge", "recycling.num_nodes": 16}`` (handy on a command line).
    """
    parts = name.split("+")
    if len(parts) != 2 or not all(parts):
        raise SpecDecError(
            f"composite drafter {name!r}: join exactly two drafter names with '+', retrieval first "
            "(e.g. 'sam+recycling' or 'pld+recycling')"
        )
    first, second = parts
    for part in parts:
        if part not in registry:
            raise SpecDecError(
                f"unknown drafter {part!r} in composite {name!r}; valid names: {', '.join(sorted(registry))}"
            )
    if first == second:
        raise SpecDecError(f"composite drafter {name!r} joins {first!r} with itself")
    own = {"mode", "threshold"}
    part_options: dict[str, dict[str, Any]] = {first: {}, second: {}}
    for key, value in options.items():
        part, dot, option = key.partition(".")
        if key in own:
            continue
        if part in part_options and not dot:
            if not isinstance(value, Mapping):
                raise SpecDecError(f"composite drafter {name!r}: options of {part!r} must be a dict, got {value!r}")
            part_options[part].update(value)
        elif part in part_options and option:
            part_options[part][option] = value
        else:
            raise SpecDecError(
                f"composite drafter {name!r} has no option {key!r}; valid options: mode, threshold, "
                f"{first}.OPTION or {first}={{...}}, {second}.OPTION or {second}={{...}}"
            )
    config = CompositeConfig(**{key: options[key] for key in own if key in options})
    retrieval_factory = registry[first](part_options[first], context)
    auxiliary_factory = registry[second](part_options[second], context)
    probe = retrieval_factory.create()
    if not isinstance(probe, RetrievalDrafter):
        raise SpecDecError(
            f"composite drafter {name!r}: the first part must be a retrieval drafter (one with match_length(), "
            f"such as 'pld'), and {first!r} is not; write the retrieval drafter first"
        )

    def build() -> Drafter:
        retrieval = retrieval_factory.create()
        assert isinstance(retrieval, RetrievalDrafter), f"{first!r} made a {type(retrieval).__name__}"
        return CompositeDrafter(retrieval, auxiliary_factory.create(), config, context.acceptance)

    return Factory(name, build)

