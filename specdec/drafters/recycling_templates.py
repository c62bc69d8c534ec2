"""Draft tree templates for Token Recycling: a fixed tree shape, named by rank paths, best first.

Token Recycling (Luo et al., *Turning Trash into Treasure: Accelerating Inference of Large
Language Models with Token Recycling*, ACL 2025) drafts by filling a fixed tree shape from
a matrix of candidate tokens. This module is that shape and how to derive one from
measurement rather than copy it.

**Rank paths.** A template node other than the root is named by its rank path
``(r_1, ..., r_d)``: from the root's token take its candidate of rank ``r_1`` (the
``r_1``-th most likely next token the model last predicted after it), from that token its
candidate of rank ``r_2``, and so on. Depth ``d`` is the path's length; the root is ``()``.

**Order.** Nodes are listed best first, every parent before its children, so a node
budget cuts a prefix and every prefix is itself a template (and a valid
:class:`~specdec.types.DraftTree` once filled).

**Deriving a template** (:func:`grow_template`). Let ``a[d-1][j]`` be the probability that
the rank-``j`` child of an accepted node at depth ``d-1`` is accepted too (the
*acceptance rate* at depth ``d`` and rank ``j``), measured on calibration prompts with
:class:`AcceptanceCounts`. Assume it depends on (depth, rank) only. Then a node is
accepted with probability ``v(node)``, the product of the rates along its rank path, and a
tree's expected number of accepted draft tokens is the sum of ``v`` over its nodes (each
accepted token is exactly one accepted node: linearity of expectation, no double count).
Rates are at most 1, so ``v(child) <= v(parent)`` and the ``N`` nodes of largest ``v`` form
a tree; growing greedily from the root, always taking the frontier node of largest ``v``,
lists them in that order, so every prefix of the result is the best tree of its size
under the model: O(N k log(N k)) for ``N`` nodes and ``k`` ranks.
"""

from __future__ import annotations

import heapq
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from specdec.errors import SpecDecError
from specdec.types import DraftTree

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

TEMPLATE_FORMAT = "specdec-tree-template"
TEMPLATE_VERSION = 1

# Saved templates shipped in specdec/data, by the name the ``template`` option takes.
SAVED_TEMPLATES = {"default": "recycling_template_smollm2.json"}


@dataclass(frozen=True, eq=False)
class TreeTemplate:
    """A tree shape: the rank path of every node but the root, best first, parents first.

    ``values`` optionally holds each non-root node's estimated acceptance probability (from
    calibration); ``default_nodes`` the node count (root included) a drafter uses unless
    told otherwise; ``meta`` free-form provenance (calibration command, data, model).

    Derived arrays, one entry per node, root first (node 0): ``parents`` int64 ``[N]``
    (``-1`` for the root), ``ranks`` int64 ``[N]`` (``-1`` for the root), ``depths`` int64 ``[N]``.

    >>> t = TreeTemplate.from_paths([[0], [1], [0, 0]])
    >>> t.parents.tolist(), t.ranks.tolist(), t.size
    ([-1, 0, 0, 1], [-1, 0, 1, 0], 4)
    """

    paths: tuple[tuple[int, ...], ...]
    name: str = ""
    values: tuple[float, ...] | None = None
    default_nodes: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    parents: IntArray = field(init=False, repr=False)
    ranks: IntArray = field(init=False, repr=False)
    depths: IntArray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        index: dict[tuple[int, ...], int] = {(): 0}
        parents, ranks, depths = [-1], [-1], [0]
        for i, path in enumerate(self.paths, start=1):
            if not path:
                raise SpecDecError(f"template {self.name!r}: path {i - 1} is empty (the root is implicit)")
            if any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in path):
                raise SpecDecError(f"template {self.name!r}: path {list(path)} holds a rank that is not an int >= 0")
            if path in index:
                raise SpecDecError(f"template {self.name!r}: path {list(path)} appears twice")
            parent = index.get(path[:-1])
            if parent is None:
                raise SpecDecError(
                    f"template {self.name!r}: path {list(path)} comes before its parent {list(path[:-1])} "
                    "(parents must precede children)"
                )
            index[path] = i
            parents.append(parent)
            ranks.append(path[-1])
            depths.append(len(path))
        if self.values is not None and len(self.values) != len(self.paths):
            raise SpecDecError(f"template {self.name!r}: {len(self.values)} values for {len(self.paths)} paths")
        if self.default_nodes is not None and not 1 <= self.default_nodes <= len(parents):
            raise SpecDecError(
                f"template {self.name!r}: default_nodes {self.default_nodes} is outside [1, {len(parents)}]"
            )
        object.__setattr__(self, "parents", np.asarray(parents, dtype=np.int64))
        object.__setattr__(self, "ranks", np.asarray(ranks, dtype=np.int64))
        object.__setattr__(self, "depths", np.asarray(depths, dtype=np.int64))

    # -- constructors -------------------------------------------------------------------
    @classmethod
    def from_paths(cls, paths: Sequence[Sequence[int]], name: str = "", **kwargs: Any) -> TreeTemplate:
        return cls(tuple(tuple(p) for p in paths), name, **kwargs)

    @classmethod
    def breadth_first(cls, num_nodes: int, k: int) -> TreeTemplate:
        """The first ``num_nodes`` nodes (root included) of the complete ``k``-ary tree in breadth-first order.

        The naive shape a measured template is compared with: every node of depth ``d`` comes
        before any of depth ``d + 1``, ranks in order.

        >>> TreeTemplate.breadth_first(5, 2).paths
        ((0,), (1,), (0, 0), (0, 1))
        """
        if num_nodes < 1 or k < 1:
            raise SpecDecError(f"breadth-first template needs num_nodes >= 1 and k >= 1, got {num_nodes} and {k}")
        paths: list[tuple[int, ...]] = []
        frontier: list[tuple[int, ...]] = [()]
        while len(paths) < num_nodes - 1:
            parent = frontier.pop(0)
            for rank in range(k):
                if len(paths) == num_nodes - 1:
                    break
                paths.append((*parent, rank))
                frontier.append((*parent, rank))
        return cls(tuple(paths), f"breadth-first-{num_nodes}")

    # -- views ----------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Nodes, root included."""
        return len(self.paths) + 1

    @property
    def max_rank(self) -> int:
        """The largest rank used (-1 for a root-only template): the matrix needs ``k > max_rank``."""
        return max((p[-1] for p in self.paths), default=-1)

    @property
    def max_depth(self) -> int:
        return int(self.depths.max())

    def prefix(self, num_nodes: int) -> TreeTemplate:
        """The first ``num_nodes`` nodes (root included)."""
        if num_nodes < 1:
            raise SpecDecError(f"a template prefix needs num_nodes >= 1, got {num_nodes}")
        n = min(num_nodes, self.size) - 1
        values = None if self.values is None else self.values[:n]
        return TreeTemplate(self.paths[:n], self.name, values, None, dict(self.meta))

    def level_counts(self) -> list[int]:
        """Nodes per depth 1, 2, ... (the way papers describe their trees)."""
        return np.bincount(self.depths[1:], minlength=self.max_depth + 1)[1:].tolist()  # type: ignore[no-any-return]

    def expected_accepted(self, num_nodes: int | None = None) -> float:
        """Estimated accepted draft tokens per step for the first ``num_nodes`` nodes (needs ``values``)."""
        if self.values is None:
            raise SpecDecError(f"template {self.name!r} carries no calibrated values")
        n = self.size if num_nodes is None else min(num_nodes, self.size)
        return float(sum(self.values[: n - 1]))

    def fill(self, tokens: Sequence[int]) -> DraftTree:
        """The draft tree carrying ``tokens[i]`` at node ``i`` (for tests and drawings)."""
        return DraftTree(tuple(tokens), tuple(self.parents.tolist()))

    # -- files ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"format": TEMPLATE_FORMAT, "version": TEMPLATE_VERSION, "name": self.name}
        if self.default_nodes is not None:
            data["default_nodes"] = self.default_nodes
        data["level_counts"] = self.level_counts()
        data["paths"] = [list(p) for p in self.paths]
        if self.values is not None:
            data["values"] = [round(v, 6) for v in self.values]
        data["meta"] = self.meta
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], origin: str = "") -> TreeTemplate:
        if data.get("format") != TEMPLATE_FORMAT:
            raise SpecDecError(f"{origin or 'template'} is not a tree template (format {data.get('format')!r})")
        if data.get("version") != TEMPLATE_VERSION:
            raise SpecDecError(f"{origin or 'template'}: unsupported template version {data.get('version')!r}")
        values = data.get("values")
        return cls.from_paths(
            data["paths"],
            str(data.get("name", "")),
            values=None if values is None else tuple(float(v) for v in values),
            default_nodes=data.get("default_nodes"),
            meta=dict(data.get("meta", {})),
        )

    def save(self, path: str | os.PathLike[str]) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TreeTemplate:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise SpecDecError(f"cannot read tree template {os.fspath(path)!r}: {error}") from error
        return cls.from_dict(data, os.fspath(path))


def saved_template(name: str) -> TreeTemplate:
    """A template shipped with specdec, by name (``"default"``: measured on the default model)."""
    filename = SAVED_TEMPLATES.get(name)
    if filename is None:
        raise SpecDecError(f"no saved tree template {name!r}; saved: {', '.join(sorted(SAVED_TEMPLATES))}")
    text = resources.files("specdec").joinpath("data", filename).read_text()
    return TreeTemplate.from_dict(json.loads(text), filename)


def resolve_template(
    spec: str | os.PathLike[str] | Sequence[Sequence[int]] | TreeTemplate, k: int = 8
) -> TreeTemplate:
    """A template from a saved name, ``"breadth-first-N"`` (ranks below ``k``), a JSON file or rank paths."""
    if isinstance(spec, TreeTemplate):
        return spec
    if isinstance(spec, (str, os.PathLike)):
        text = os.fspath(spec)
        if text in SAVED_TEMPLATES:
            return saved_template(text)
        if text.startswith("breadth-first-"):
            size = text.removeprefix("breadth-first-")
            if not size.isdigit() or int(size) < 1:
                raise SpecDecError(f"template {text!r}: expected breadth-first-N with N >= 1 nodes")
            return TreeTemplate.breadth_first(int(size), k)
        if Path(text).suffix == ".json" or Path(text).is_file():
            return TreeTemplate.load(text)
        raise SpecDecError(
            f"unknown tree template {text!r}: give a saved name ({', '.join(sorted(SAVED_TEMPLATES))}), "
            "'breadth-first-N', a .json file or a list of rank paths"
        )
    if isinstance(spec, Sequence) and not isinstance(spec, str):
        return TreeTemplate.from_paths(spec, "custom")
    raise SpecDecError(f"a tree template is a name, a file or rank paths, got {type(spec).__name__}")


def grow_template(rates: FloatArray, num_nodes: int, name: str = "", **kwargs: Any) -> TreeTemplate:
    """The best ``num_nodes``-node template (root included) under per-(depth, rank) acceptance ``rates``.

    ``rates`` float ``[D, k]``: ``rates[d - 1, j]`` is the acceptance rate of a rank-``j``
    child at depth ``d``. Nodes deeper than ``D`` are never grown. Greedy by expected value
    (see the module docstring), ties broken by depth, then rank path, so the result is
    deterministic. O(N k log(N k)).

    >>> grow_template(np.array([[0.5, 0.2], [0.6, 0.1]]), 4).paths
    ((0,), (0, 0), (1,))
    """
    rates = np.asarray(rates, dtype=np.float64)
    if rates.ndim != 2 or rates.shape[0] < 1 or rates.shape[1] < 1:
        raise SpecDecError(f"rates must be a [depth, k] array, got shape {rates.shape}")
    if np.isnan(rates).any() or (rates < 0).any() or (rates > 1).any():
        raise SpecDecError("rates must be probabilities in [0, 1]")
    if num_nodes < 1:
        raise SpecDecError(f"num_nodes must be >= 1, got {num_nodes}")
    depth_limit, k = rates.shape
    frontier: list[tuple[float, int, tuple[int, ...]]] = []

    def offer(parent: tuple[int, ...], value: float) -> None:
        depth = len(parent) + 1
        if depth > depth_limit:
            return
        for rank in range(k):
            child_value = value * float(rates[depth - 1, rank])
            if child_value > 0.0:
                heapq.heappush(frontier, (-child_value, depth, (*parent, rank)))

    offer((), 1.0)
    paths: list[tuple[int, ...]] = []
    values: list[float] = []
    while frontier and len(paths) < num_nodes - 1:
        negative, _, path = heapq.heappop(frontier)
        paths.append(path)
        values.append(-negative)
        offer(path, -negative)
    return TreeTemplate(tuple(paths), name, tuple(values), **kwargs)


class AcceptanceCounts:
    """Per-(depth, rank) acceptance counts, gathered from verified draft trees.

    For every step: each child of an accepted node was *offered*; the one carrying the
    model's choice (if any) was *accepted*. ``offered[d - 1, j]`` / ``accepted[d - 1, j]``
    count rank-``j`` children at depth ``d``; int64 ``[max_depth, k]``.
    """

    def __init__(self, max_depth: int, k: int) -> None:
        self.offered = np.zeros((max_depth, k), dtype=np.int64)
        self.accepted = np.zeros((max_depth, k), dtype=np.int64)
        self.steps = 0

    def record(self, template: TreeTemplate, nodes: Sequence[int], parents: Sequence[int], path: Sequence[int]) -> None:
        """Count one step.

        ``nodes[i]`` is the template node that tree node ``i`` filled, ``parents`` the tree's
        parent indices, ``path`` the accepted tree nodes, root first. O(tree size).
        """
        self.steps += 1
        on_path = set(path)
        for i in range(1, len(nodes)):
            if parents[i] not in on_path:
                continue
            depth = int(template.depths[nodes[i]])
            rank = int(template.ranks[nodes[i]])
            if depth > self.offered.shape[0] or rank >= self.offered.shape[1]:
                continue
            self.offered[depth - 1, rank] += 1
            self.accepted[depth - 1, rank] += i in on_path

    def rates(self, min_offered: int = 20) -> FloatArray:
        """Acceptance rates as float ``[max_depth, k]``: measured, filled in, then made monotone in rank.

        1. ``accepted / offered`` where a (depth, rank) was offered ``min_offered`` times
           or more; elsewhere the rate of the same rank one level up stands in (0 at depth
           1): deep, rarely reached nodes are too few to measure, and acceptance changes
           slowly with depth.
        2. Within each depth, rates are made non-increasing in rank by weighted isotonic
           regression (pool adjacent violators, weights = times offered): a candidate the
           model ranked lower is not more likely to be right, so a higher measured rate at a
           higher rank is sampling noise, and pooling is the least-squares fix.
        """
        depth_limit, k = self.offered.shape
        raw = np.zeros((depth_limit, k), dtype=np.float64)
        weight = np.ones((depth_limit, k), dtype=np.float64)
        for d in range(depth_limit):
            for j in range(k):
                if self.offered[d, j] >= min_offered:
                    raw[d, j] = self.accepted[d, j] / self.offered[d, j]
                    weight[d, j] = float(self.offered[d, j])
                elif d > 0:
                    raw[d, j], weight[d, j] = raw[d - 1, j], weight[d - 1, j]
        return np.stack([_non_increasing(raw[d], weight[d]) for d in range(depth_limit)])


def _non_increasing(values: FloatArray, weights: FloatArray) -> FloatArray:
    """Weighted least-squares non-increasing fit (pool adjacent violators). O(len) amortized.

    >>> _non_increasing(np.array([0.4, 0.1, 0.3]), np.array([1.0, 1.0, 1.0])).tolist()
    [0.4, 0.2, 0.2]
    """
    blocks: list[list[float]] = []  # [mean, weight, count]
    for value, weight in zip(values.tolist(), weights.tolist(), strict=True):
        blocks.append([value, weight, 1])
        while len(blocks) > 1 and blocks[-2][0] < blocks[-1][0]:
            mean, w, n = blocks.pop()
            prev = blocks[-1]
            total = prev[1] + w
            prev[0] = (prev[0] * prev[1] + mean * w) / total
            prev[1], prev[2] = total, prev[2] + n
    return np.asarray([b[0] for b in blocks for _ in range(int(b[2]))], dtype=np.float64)
