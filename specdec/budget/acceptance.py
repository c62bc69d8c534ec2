"""The acceptance model: how likely each draft node is to be accepted, learned from verified steps.

Symbols. For draft node ``i`` with parent ``parent(i)``:

- ``q_i = P(i accepted | parent(i) accepted)``, the **conditional acceptance** of the node;
- ``p_i = P(i accepted) = q_i * p_parent(i)``, with ``p_0 = 1`` (the root, the pending
  token, is always accepted).

Greedy acceptance walks one path, so a node set ``S`` that is prefix-closed (every parent
in ``S`` with its child) accepts ``sum(p_i for i in S, i >= 1)`` draft tokens on average,
and the step emits one more (the bonus). Since ``q_i <= 1``, ``p`` never grows from a parent
to its child: the ``k`` nodes of largest ``p`` (ties to the lower index) always form a
prefix-closed subtree, which is what lets the planner cut any tree to any budget.

**What ``q`` depends on.** Only on what the drafter knew when it proposed the node, as a
key of four parts: the node's **source** (``DraftTree.node_sources`` or the tree's
``source``), its **feature** (``DraftTree.node_features``: an int the drafter chose, such as
PLD's n-gram length or a suffix automaton's match length; ``-1`` when the drafter reports
none), its **depth** and its **rank** among its siblings in the drafter's order (0 = the
drafter's first choice). Depths above :data:`MAX_DEPTH_KEY` and ranks above
:data:`MAX_RANK_KEY` share a key.

**Estimation.** Every verified node whose parent was accepted is a Bernoulli trial of its
``q``: a hit when the node is on the accepted path. Trials of a node with no accepted
parent say nothing of ``q`` and are skipped. Counts are kept at four nested levels,
``(source)`` contains ``(source, feature)`` contains ``(source, feature, depth)`` contains
the full key, so the trials of a key split into disjoint **rings**: its own, those of its
depth level but other ranks, of its feature but other depths, of its source but other
features. Each ring shrinks toward the estimate of the rings outside it (a hierarchical
Beta prior, every trial counted once)::

    q_0 = prior
    q_L = (hits in ring L + prior_weight * q_{L-1}) / (trials in ring L + prior_weight)   L = 1..4

(ring 1 the outermost, ring 4 the key's own trials), so a key seen rarely borrows from
its neighbours, and a source never seen gets ``prior``. Siblings are exclusive (at most
one child of a node is accepted), so when the ``q`` of a node's children sum past 1 they
are scaled down to sum to 1.

**Memory.** All counts decay by ``memory`` per verified step (one clock for all keys, so
the rings stay consistent): the model follows a drift in acceptance (a new kind of prompt)
within ~``1 / (1 - memory)`` steps, and a key whose estimate fell too low to be verified
again drifts back toward its neighbours' rate and is retried: exploration comes from
forgetting, not from a separate rule.

Cost: O(N) dictionary lookups per tree of ``N`` nodes for both :meth:`AcceptanceModel.estimate`
and :meth:`AcceptanceModel.observe` (four levels per node; repeated keys are memoized).
Memory: two floats and a stamp per key and level seen.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from specdec.errors import SpecDecError
from specdec.types import DraftTree

FloatArray = npt.NDArray[np.float64]

# Keys beyond these share one bucket: deep nodes of a long chain behave alike, and a
# drafter's 9th choice is as rare as its 12th.
MAX_DEPTH_KEY = 16
MAX_RANK_KEY = 7
NO_FEATURE = -1

NodeKey = tuple[str, int, int, int]  # (source, feature, depth bucket, rank bucket)

# Upper edges of the match-length buckets of :func:`length_feature`: exact up to 4, then two per octave.
_LENGTH_EDGES = (1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65)


def length_feature(length: int) -> int:
    """A node feature from a match length: exact up to 4, then two buckets per doubling (0..13).

    Features are categories to the acceptance model; a drafter whose natural feature is an
    unbounded length (a suffix automaton's match, REST's query) buckets it here, so that
    lengths that predict alike share their trials. O(log 13).

    >>> [length_feature(n) for n in (0, 1, 4, 5, 6, 7, 12, 13, 40, 500)]
    [0, 1, 4, 5, 5, 6, 7, 8, 11, 13]
    """
    return bisect.bisect_right(_LENGTH_EDGES, max(int(length), 0))


def node_keys(tree: DraftTree) -> list[NodeKey]:
    """The key of every node (the root's is a placeholder, never estimated). O(N).

    >>> node_keys(DraftTree((5, 6, 7, 8), (-1, 0, 0, 1), source="t"))[1:]
    [('t', -1, 1, 0), ('t', -1, 1, 1), ('t', -1, 2, 0)]
    """
    sources = tree.node_sources
    features = tree.node_features
    next_rank = [0] * tree.size  # children seen so far, per parent
    keys: list[NodeKey] = [(tree.source, NO_FEATURE, 0, 0)]
    for i in range(1, tree.size):
        parent = tree.parents[i]
        rank = next_rank[parent]
        next_rank[parent] = rank + 1
        keys.append(
            (
                tree.source if sources is None else sources[i],
                NO_FEATURE if features is None else features[i],
                min(tree.depths[i], MAX_DEPTH_KEY),
                min(rank, MAX_RANK_KEY),
            )
        )
    return keys


@dataclass
class _Counts:
    """Trials and hits of one key at one level, decayed up to step ``stamp``."""

    trials: float = 0.0
    hits: float = 0.0
    stamp: int = 0


class AcceptanceModel:
    """Per-key conditional acceptance ``q``, learned online; see the module docstring.

    >>> model = AcceptanceModel(prior=0.5, prior_weight=2.0, memory=1.0)
    >>> tree = DraftTree.chain(1, [2, 3], source="pld")
    >>> [round(float(p), 3) for p in model.estimate(tree, node_keys(tree))[1]]
    [1.0, 0.5, 0.25]
    >>> model.observe(tree, node_keys(tree), accepted_nodes=(0, 1))  # node 1 hit, node 2 missed
    >>> round(model.conditional(("pld", -1, 1, 0)), 3), round(model.conditional(("pld", -1, 2, 0)), 3)
    (0.556, 0.444)
    """

    def __init__(self, prior: float = 0.5, prior_weight: float = 2.0, memory: float = 0.995) -> None:
        if not 0.0 < prior < 1.0:
            raise SpecDecError(f"acceptance prior must be in (0, 1), got {prior!r}")
        if not prior_weight > 0.0:
            raise SpecDecError(f"acceptance prior_weight must be > 0, got {prior_weight!r}")
        if not 0.0 < memory <= 1.0:
            raise SpecDecError(f"acceptance memory must be in (0, 1], got {memory!r}")
        self.prior = float(prior)
        self.prior_weight = float(prior_weight)
        self.memory = float(memory)
        self.steps = 0  # the clock: verified trees observed
        self._counts: dict[tuple[object, ...], _Counts] = {}

    def _current(self, level_key: tuple[object, ...]) -> tuple[float, float]:
        """``(trials, hits)`` of one level's key, decayed to now."""
        counts = self._counts.get(level_key)
        if counts is None:
            return 0.0, 0.0
        factor = self.memory ** (self.steps - counts.stamp)
        return counts.trials * factor, counts.hits * factor

    def conditional(self, key: NodeKey) -> float:
        """``q`` for one key, before the sibling constraint: rings shrunk from the outside in.

        The hot path of :meth:`estimate` (once per distinct key of a tree), hence plain
        comparisons instead of ``min``/``max`` and one pass over the four levels.
        """
        counts, memory, now = self._counts, self.memory, self.steps
        trials = [0.0, 0.0, 0.0, 0.0]  # decayed counts of the nested levels, outermost first
        hits = [0.0, 0.0, 0.0, 0.0]
        for level in range(4):
            found = counts.get(key[: level + 1])
            if found is not None:
                factor = 1.0 if found.stamp == now else memory ** (now - found.stamp)
                trials[level] = found.trials * factor
                hits[level] = found.hits * factor
        q, weight = self.prior, self.prior_weight
        for level in range(4):
            ring_trials, ring_hits = trials[level], hits[level]
            if level < 3:  # this ring is the level minus the next one in
                ring_trials -= trials[level + 1]
                ring_hits -= hits[level + 1]
                if ring_trials < 0.0:  # rounding of the decayed sums
                    ring_trials = 0.0
                if ring_hits < 0.0:
                    ring_hits = 0.0
                elif ring_hits > ring_trials:
                    ring_hits = ring_trials
            q = (ring_hits + weight * q) / (ring_trials + weight)
        return q

    def estimate(self, tree: DraftTree, keys: Sequence[NodeKey],
                 memo: dict[NodeKey, float] | None = None) -> tuple[FloatArray, FloatArray]:
        """``(q, p)`` for every node of ``tree``, float64 ``[N]`` each; ``q[0] = p[0] = 1``. O(N).
        ``memo``: as for :meth:`estimate_lists`."""
        q, p = self.estimate_lists(tree, keys, memo)
        return np.asarray(q, dtype=np.float64), np.asarray(p, dtype=np.float64)

    def estimate_lists(self, tree: DraftTree, keys: Sequence[NodeKey],
                       memo: dict[NodeKey, float] | None = None) -> tuple[list[float], list[float]]:
        """:meth:`estimate` as lists (plain Python beats NumPy on the few nodes of one draft).

        ``memo`` caches ``conditional`` by key; a caller may keep one across trees for as
        long as the model observes nothing (a batch of drafts between two verifications).
        """
        memo = {} if memo is None else memo
        parents = tree.parents
        n = len(parents)
        q = [1.0] * n
        sibling_sum = [0.0] * n  # sum of q over each node's children
        for i in range(1, n):
            key = keys[i]
            value = memo.get(key)
            if value is None:
                value = memo[key] = self.conditional(key)
            q[i] = value
            sibling_sum[parents[i]] += value
        p = [1.0] * n
        for i in range(1, n):
            parent = parents[i]
            if sibling_sum[parent] > 1.0:  # exclusive siblings sum to <= 1
                q[i] /= sibling_sum[parent]
            p[i] = q[i] * p[parent]
        return q, p

    def observe(self, tree: DraftTree, keys: Sequence[NodeKey], accepted_nodes: Sequence[int]) -> None:
        """Learn from one verified tree: each node whose parent was accepted is one trial. O(N)."""
        self.steps += 1
        accepted = set(accepted_nodes)
        now = self.steps
        for i in range(1, tree.size):
            if tree.parents[i] not in accepted:
                continue
            hit = 1.0 if i in accepted else 0.0
            key = keys[i]
            for level in range(1, 5):
                counts = self._counts.get(key[:level])
                if counts is None:
                    counts = self._counts[key[:level]] = _Counts(stamp=now)
                elif counts.stamp != now:
                    factor = self.memory ** (now - counts.stamp)
                    counts.trials *= factor
                    counts.hits *= factor
                    counts.stamp = now
                counts.trials += 1.0
                counts.hits += hit

    def state(self, min_trials: float = 0.01) -> list[list[object]]:
        """What the model has learned, as JSON-ready rows ``[key..., trials, hits]`` decayed to now.

        ``key...`` is a level's key (1 to 4 parts: source, feature, depth, rank). Levels whose
        decayed trials fell under ``min_trials`` are left out: forgotten, they would only
        grow a saved file. :meth:`load_state` reads the rows back. O(keys).
        """
        rows: list[list[object]] = []
        for level_key in sorted(self._counts, key=lambda k: tuple(map(str, k))):
            trials, hits = self._current(level_key)
            if trials >= min_trials:
                rows.append([*level_key, trials, hits])
        return rows

    def load_state(self, rows: Sequence[Sequence[object]]) -> None:
        """Replace what the model knows with ``rows`` from :meth:`state` (another run's, saved).

        Every row is checked before anything changes: a key of 1 to 4 parts (a source
        string, then ints), finite counts with ``0 <= hits <= trials``. A bad row raises
        :class:`SpecDecError` naming it and leaves the model as it was. O(rows).
        """
        loaded: dict[tuple[object, ...], _Counts] = {}
        for row in rows:
            if not isinstance(row, (list, tuple)) or not 3 <= len(row) <= 6:
                raise SpecDecError(f"acceptance state: a row must be [key (1-4 parts), trials, hits], got {row!r}")
            *key, trials, hits = row
            if not isinstance(key[0], str) or any(isinstance(k, bool) or not isinstance(k, int) for k in key[1:]):
                raise SpecDecError(f"acceptance state: a key must be a source then ints, got {key!r}")
            if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in (trials, hits)):
                raise SpecDecError(f"acceptance state: counts must be numbers, got {row!r}")
            trials, hits = float(trials), float(hits)
            if not (np.isfinite(trials) and 0.0 <= hits <= trials * (1.0 + 1e-9)):
                raise SpecDecError(f"acceptance state: counts must be finite with 0 <= hits <= trials, got {row!r}")
            loaded[tuple(key)] = _Counts(trials, min(hits, trials), self.steps)
        self._counts = loaded

    def trials(self, key_prefix: tuple[object, ...]) -> float:
        """Decayed trial count at one level (``(source,)``, ``(source, feature)``, ...); 0 if unseen."""
        return self._current(key_prefix)[0]

    def table(self) -> list[dict[str, object]]:
        """Every full key seen, with its decayed trials, hit rate and estimate ``q`` (for reports)."""
        rows = []
        for key in sorted((k for k in self._counts if len(k) == 4), key=lambda k: tuple(map(str, k))):
            trials, hits = self._current(key)
            rows.append(
                {
                    "source": key[0],
                    "feature": key[1],
                    "depth": key[2],
                    "rank": key[3],
                    "trials": round(trials, 2),
                    "hit_rate": round(hits / trials, 4) if trials else None,
                    "q": round(self.conditional(key), 4),  # type: ignore[arg-type]
                }
            )
        return rows
