"""The vocabulary of specdec, as types.

Words used everywhere in the package (and only in these senses):

- **committed**: tokens whose keys and values are in the target model's KV cache.
- **pending**: the one token after the committed ones that is already decided (the
  model chose it) but whose KV is not computed yet. Every step verifies a tree rooted at it.
- **draft**: tokens a drafter guesses will follow the pending token, arranged as a tree.
- **verify**: one forward of the target over all tree nodes under a tree-attention mask.
- **accepted**: the walked path from the root, following at each node the child that
  carries the model's own choice there. The root is always accepted.
- **bonus**: the model's own choice after the last accepted node; it becomes the new
  pending token. A step therefore emits ``len(accepted) - 1`` draft tokens plus the bonus.
- **position** (what rotary embeddings see) vs **slot** (where keys and values are
  written): node ``i`` sits at position ``committed_len + depth(i)`` and is written to
  slot ``committed_len + i``; compaction moves accepted nodes' slots into place.

Drafters never see the model: tokens in, a :class:`DraftTree` out, and what they learn
from the model reaches them as plain token ids (:class:`Feedback`). Verifiers never see
drafters, and everything above the backends sees a verifier only through the
:class:`Verifier` protocol. Per-sequence state (a drafter instance, a verifier's
:class:`SequenceState`) is kept apart from shared read-only indexes, so that many sequences
can share one datastore.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np
import numpy.typing as npt

from specdec.errors import InvalidDraftTreeError, SpecDecError

IntArray = npt.NDArray[np.int64]


def _raise_first_violation(tokens: tuple[int, ...], parents: tuple[int, ...]) -> None:
    """Scan node by node and raise for the first broken invariant (the tree is known to be bad)."""
    seen_children: set[tuple[int, int]] = set()
    for i in range(len(tokens)):
        if tokens[i] < 0:
            raise InvalidDraftTreeError(f"tokens[{i}] = {tokens[i]} is negative")
        if i == 0:
            continue
        parent = parents[i]
        if not 0 <= parent < i:
            raise InvalidDraftTreeError(
                f"parents[{i}] = {parent}: every parent must precede its child (0 <= parent < {i})"
            )
        key = (parent, tokens[i])
        if key in seen_children:
            raise InvalidDraftTreeError(f"node {i} repeats token {tokens[i]} among the children of node {parent}")
        seen_children.add(key)
    raise AssertionError(f"no violation found in tokens={tokens} parents={parents}")


@dataclass(frozen=True, eq=False)
class DraftTree:
    """A draft: ``tokens[N]`` and ``parents[N]``, node 0 the root (the pending token).

    Invariants, checked on construction (a bad tree raises :class:`InvalidDraftTreeError`):

    - ``parents[0] == -1`` and ``0 <= parents[i] < i`` for ``i >= 1`` (topological order);
    - siblings carry distinct tokens (otherwise two nodes would verify the same path);
    - tokens are non-negative ints.

    Because parents precede children, **every prefix** ``tokens[:k], parents[:k]`` is itself
    a valid tree. Drafters emit nodes best-first, so a node budget cuts a prefix (:meth:`prefix`).

    ``source`` names the drafter that produced the tree (composites label each step);
    ``node_sources`` optionally labels every node (merged trees from several sources).
    ``node_features`` optionally gives every node a small int ``>= 0`` saying what the
    drafter knew when it proposed it (PLD's n-gram length, a suffix automaton's match
    length): the budget planner learns acceptance per source, feature, depth and sibling
    rank (:mod:`specdec.budget.acceptance`); without features, per source, depth and rank.

    >>> tree = DraftTree.chain(7, [8, 9])
    >>> tree.parents, tree.depths
    ((-1, 0, 1), (0, 1, 2))
    """

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    source: str = ""
    node_sources: tuple[str, ...] | None = None
    node_features: tuple[int, ...] | None = None
    depths: tuple[int, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # Drafters build a tree every step, so the common (valid) case runs mostly in C:
        # map(int, ...) normalizes NumPy ints, min() and a set of (parent, token) pairs check
        # signs and sibling tokens, and only the parent/depth loop is Python (~10 us for 80
        # nodes). A failed check reruns the node-by-node scan, which names the first bad node.
        tokens = tuple(map(int, self.tokens))
        parents = tuple(map(int, self.parents))
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "parents", parents)
        n = len(tokens)
        if n == 0:
            raise InvalidDraftTreeError("a draft tree needs at least the root node (the pending token)")
        if len(parents) != n:
            raise InvalidDraftTreeError(f"tokens has {n} entries but parents has {len(parents)}")
        if parents[0] != -1:
            raise InvalidDraftTreeError(f"parents[0] must be -1 (node 0 is the root), got {parents[0]}")
        if self.node_sources is not None and len(self.node_sources) != n:
            raise InvalidDraftTreeError(f"node_sources has {len(self.node_sources)} entries for {n} nodes")
        if self.node_features is not None:
            features = tuple(map(int, self.node_features))
            object.__setattr__(self, "node_features", features)
            if len(features) != n:
                raise InvalidDraftTreeError(f"node_features has {len(features)} entries for {n} nodes")
            if min(features) < 0:
                raise InvalidDraftTreeError(f"node_features must be >= 0, got {min(features)}")
        depths = [0] * n
        valid = min(tokens) >= 0 and len(set(zip(parents, tokens, strict=True))) == n
        if valid:
            for i in range(1, n):
                parent = parents[i]
                if not 0 <= parent < i:
                    valid = False
                    break
                depths[i] = depths[parent] + 1
        if not valid:
            _raise_first_violation(tokens, parents)
        object.__setattr__(self, "depths", tuple(depths))

    # -- constructors -------------------------------------------------------------------
    @classmethod
    def single(cls, pending: int, source: str = "") -> DraftTree:
        """The one-node tree: a plain autoregressive step."""
        return cls((pending,), (-1,), source)

    @classmethod
    def chain(cls, pending: int, draft: Sequence[int], source: str = "", feature: int | None = None) -> DraftTree:
        """A linear draft ``pending -> draft[0] -> draft[1] ...``; ``feature`` labels every node."""
        n = len(draft) + 1
        features = None if feature is None else (feature,) * n
        return cls((pending, *draft), tuple(range(-1, n - 1)), source, None, features)

    # -- derived views ------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Number of nodes, root included (what the target forward pays for)."""
        return len(self.tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def max_depth(self) -> int:
        return max(self.depths)

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def prefix(self, max_nodes: int) -> DraftTree:
        """The first ``max_nodes`` nodes (a valid tree, since parents precede children)."""
        if max_nodes < 1:
            raise InvalidDraftTreeError(f"max_nodes must be >= 1, got {max_nodes}")
        if max_nodes >= self.size:
            return self
        sources = None if self.node_sources is None else self.node_sources[:max_nodes]
        features = None if self.node_features is None else self.node_features[:max_nodes]
        return DraftTree(self.tokens[:max_nodes], self.parents[:max_nodes], self.source, sources, features)

    def pruned(self, max_nodes: int, max_depth: int) -> DraftTree:
        """At most ``max_nodes`` nodes, none deeper than ``max_depth`` (order kept)."""
        tree = self.prefix(max_nodes)
        if tree.max_depth <= max_depth:
            return tree
        return tree.select([i for i in range(tree.size) if tree.depths[i] <= max_depth])

    def select(self, nodes: Sequence[int]) -> DraftTree:
        """The subtree of ``nodes`` (increasing indices, root first, each node's parent among them). O(N).

        >>> DraftTree((5, 6, 7, 8), (-1, 0, 0, 1)).select([0, 1, 3]).parents
        (-1, 0, 1)
        """
        remap = {old: new for new, old in enumerate(nodes)}
        if not nodes or nodes[0] != 0 or list(nodes) != sorted(remap):
            raise InvalidDraftTreeError(f"select needs increasing node indices from the root 0, got {list(nodes)}")
        orphans = [i for i in nodes[1:] if self.parents[i] not in remap]
        if orphans:
            raise InvalidDraftTreeError(f"select keeps node {orphans[0]} without its parent {self.parents[orphans[0]]}")
        parents = tuple(-1 if i == 0 else remap[self.parents[i]] for i in nodes)
        sources = None if self.node_sources is None else tuple(self.node_sources[i] for i in nodes)
        features = None if self.node_features is None else tuple(self.node_features[i] for i in nodes)
        return DraftTree(tuple(self.tokens[i] for i in nodes), parents, self.source, sources, features)

    def children(self) -> list[dict[int, int]]:
        """``children()[i][token] = j`` when node j is the child of node i carrying ``token``."""
        table: list[dict[int, int]] = [{} for _ in self.tokens]
        for i in range(1, self.size):
            table[self.parents[i]][self.tokens[i]] = i
        return table

    def walk(self, choices: Sequence[int]) -> tuple[int, ...]:
        """The accepted path: from the root, follow the child carrying ``choices[node]`` while there is one.

        ``choices[i]`` is the token chosen after node ``i`` (the model's own, at verification).

        >>> DraftTree((5, 6, 7, 8), (-1, 0, 0, 1)).walk([6, 8, 0, 0])
        (0, 1, 3)
        """
        children = self.children()
        node, path = 0, [0]
        while (child := children[node].get(choices[node])) is not None:
            path.append(child)
            node = child
        return tuple(path)

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root to ``node`` inclusive."""
        path = []
        while node != -1:
            path.append(node)
            node = self.parents[node]
        return path[::-1]


@dataclass(frozen=True, eq=False)
class Feedback:
    """What the target predicted, as token ids: drafters that learn from the model read this.

    ``topk[m]`` holds the model's ``k`` most likely next tokens (best first, ties to the
    lower id) after the occurrence of ``tokens[m]`` that was verified: one row per tree node
    after a step, one row per prompt position after prefill (when asked for).
    ``accepted_nodes`` are the rows of the accepted path after a step, root first (empty
    after prefill), so a drafter can tell the committed context's predictions from those
    made on rejected branches.

    ``features``, for drafters that ask for them (``feedback_features``, below, e.g. the EAGLE head):
    the model's last hidden state, after its final norm (the LM head's input), at every row, where
    the verifier's forward can hand it over (:class:`~specdec.backends.forward.FeatureForward`);
    None otherwise.

    Shapes: ``tokens`` int64 ``[M]``; ``topk`` int64 ``[M, k]`` (``k`` may be 0 when only features were
    asked for); ``features`` float ``[M, H]`` in the model's dtype, on its device.
    """

    tokens: IntArray
    topk: IntArray
    accepted_nodes: tuple[int, ...] = ()
    features: Any = None


@dataclass(frozen=True)
class Verification:
    """The outcome of verifying one draft tree.

    ``accepted_nodes`` are tree node indices from the root (always node 0) down the walked
    path; ``accepted_tokens`` their tokens, now committed. ``bonus`` is the model's own
    token after the last accepted node: the new pending token.
    """

    accepted_nodes: tuple[int, ...]
    accepted_tokens: tuple[int, ...]
    bonus: int
    feedback: Feedback | None = None

    @property
    def emitted(self) -> int:
        """New tokens this step adds to the output: accepted draft tokens plus the bonus."""
        return len(self.accepted_tokens)


@runtime_checkable
class Drafter(Protocol):
    """A per-sequence drafter: tokens in, a draft tree out.

    The engine calls, for one sequence::

        drafter.reset(prompt)                        # committed = prompt
        loop:
            tree = drafter.propose(pending, max_nodes)
            ...verify...
            drafter.update(accepted_tokens, feedback)  # accepted_tokens[0] is the old pending

    A batch may skip ``propose`` on a step where drafting does not pay
    (:class:`~specdec.budget.batch_planner.RowGate`, :class:`~specdec.budget.batch_planner.BatchGuard`):
    that step verifies the pending token alone, and ``update`` still follows (with no feedback),
    so a drafter keeps its state in ``reset`` and ``update``, never in ``propose``.

    ``feedback_topk`` is how many top token ids per verified node the drafter wants in
    :class:`Feedback` (0: none, and the verifier skips computing them). A drafter object
    keeps its learned state across :meth:`reset` calls if it has any (Token Recycling's
    matrix), so reusing one object across requests is how a user keeps that state.

    A drafter with a true ``feedback_features`` attribute (optional; absent means False) also gets
    the model's features of every verified node, and of every prompt position at reset
    (:attr:`Feedback.features`), on every step, the ones it did not draft for included.
    """

    name: str
    feedback_topk: int

    def reset(self, prompt: Sequence[int], feedback: Feedback | None = None) -> None:
        """Start a new sequence whose committed tokens are ``prompt``."""
        ...

    def propose(self, pending: int, max_nodes: int) -> DraftTree:
        """A tree rooted at ``pending`` with at most ``max_nodes`` nodes (root included), best nodes first."""
        ...

    def update(self, accepted: Sequence[int], feedback: Feedback | None) -> None:
        """``accepted`` were committed (root first); ``feedback`` covers every verified node."""
        ...


@runtime_checkable
class RetrievalDrafter(Drafter, Protocol):
    """A drafter whose draft continues a match of the context's ending (PLD, suffix automata, REST).

    Composites (SAM-Decoding's Algorithm 2) choose between a retrieval draft and an
    auxiliary drafter's tree by how long that match is.
    """

    def match_length(self) -> int:
        """Tokens of the context's ending (pending token included) behind the last proposal; 0: no match."""
        ...


class DrafterFactory(Protocol):
    """Makes per-sequence drafters that share read-only indexes (datastores)."""

    @property
    def name(self) -> str: ...

    def create(self) -> Drafter: ...


class TokenChooser(Protocol):
    """Decides the model's own token at each verified node (greedy or position-keyed sampling).

    ``choose(logits[N, V], positions[N])`` returns int64 ``[N]``, where ``positions[i]`` is
    the absolute position of the token being chosen (one past node i's position). A
    chooser must depend only on the logits and the position, so the same token comes
    out whether a position is reached by a plain or by a speculative step.
    """

    def choose(self, logits: Any, positions: Any) -> Any: ...


DEFAULT_KERNEL = "default"  # the model's own layers: the kernel variant every verifier runs


@dataclass(frozen=True)
class KernelChoice:
    """Which kernel variant a verification forward runs, by its number of rows (tokens in the forward).

    ``ranges``: ``(up_to, variant)`` pairs with increasing ``up_to``: a forward over ``rows``
    tokens (one tree's nodes; a batched verifier's rows of all its trees) runs the variant of
    the first range with ``rows <= up_to``, and ``beyond`` past the last range. Variants are
    names a verifier offers (:meth:`Verifier.kernel_variants`): ``"default"`` the model's own
    forward's kernels, ``"cpu"`` specdec's CPU kernels (:mod:`specdec.backends.specdec_engine.cpu_kernels`, on
    ``engine="specdec"``).
    A new kind of kernel is a new name, not a new field: the value and the protocol stay.
    Calibration decides the choice where it measured each variant (:mod:`specdec.budget.calibration`).

    >>> choice = KernelChoice(((1, "cpu"), (4, "default"), (32, "cpu")))
    >>> [choice.variant_for(rows) for rows in (1, 3, 5, 33)]
    ['cpu', 'default', 'cpu', 'default']
    >>> KernelChoice.uniform("cpu").variant_for(4096)
    'cpu'
    """

    ranges: tuple[tuple[int, str], ...] = ()
    beyond: str = DEFAULT_KERNEL

    def __post_init__(self) -> None:
        ranges = tuple((up_to, variant) for up_to, variant in self.ranges)
        object.__setattr__(self, "ranges", ranges)
        bounds = [up_to for up_to, _ in ranges]
        if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in bounds) or bounds != sorted(set(bounds)):
            raise SpecDecError(f"kernel choice ranges need increasing positive row counts, got {list(ranges)}")
        if any(not isinstance(name, str) or not name for name in (*self.variants(),)):
            raise SpecDecError(f"kernel variants are non-empty names, got {list(ranges)} and beyond={self.beyond!r}")

    @classmethod
    def uniform(cls, variant: str) -> KernelChoice:
        """``variant`` for forwards of every size."""
        return cls((), variant)

    def variant_for(self, rows: int) -> str:
        """The variant a forward over ``rows`` tokens runs."""
        for up_to, variant in self.ranges:
            if rows <= up_to:
                return variant
        return self.beyond

    def variants(self) -> tuple[str, ...]:
        """Every variant the choice names, in order of first use."""
        return tuple(dict.fromkeys([*(variant for _, variant in self.ranges), self.beyond]))


class SequenceState(Protocol):
    """One sequence's state inside a verifier (its KV cache, how its tokens are decided), opaque above it.

    The engine reads only how many tokens are committed; everything else is the verifier's.
    """

    @property
    def committed_len(self) -> int: ...


StateT = TypeVar("StateT", bound=SequenceState)


@dataclass(frozen=True)
class VerifierDescription:
    """What a verifier is, as one value (a fresh one at every ask, so it is never stale).

    ``engine``: what runs the forward (``"specdec"``, ``"hf"``, ``"compiled"``, ...; ``"replay"``);
    ``tree_ops``: its tree operations (``"torch"``, ``"cuda_ext"``); ``device``, ``dtype``: torch's;
    ``vocab_size``; ``context_length`` and ``max_tree_nodes`` (None: no limit of its own);
    ``kernel_path``: the CPU kernels' path its forwards take (``"-"``: none of specdec's).
    """

    engine: str
    tree_ops: str
    device: Any
    dtype: Any
    vocab_size: int
    context_length: int | None
    max_tree_nodes: int | None
    kernel_path: str = "-"


class Verifier(Protocol[StateT]):
    """The model side of the loop: one step (prefill, verify, rewind, release) and what it is.

    The engine calls, for one sequence::

        state, pending, feedback = verifier.prefill(prompt, ...)   # committed = prompt
        loop:
            result = verifier.verify(state, tree, topk)             # one forward, walk, keep the accepted KV
        verifier.release(state)                                     # the sequence is over

    Implemented by :class:`~specdec.backends.verifier.ModelVerifier` (every engine: one class
    composed of a forward, tree ops and a token chooser), and by the replayed
    :class:`~specdec.bench.stream_replay.ReplayVerifier`; ``StateT`` is
    each one's per-sequence state. :attr:`description` says what it is
    (:class:`VerifierDescription`); calibration and the planner's memory need more of it
    (:class:`TunableVerifier`).
    """

    @property
    def description(self) -> VerifierDescription: ...

    def prefill(
        self, prompt: Sequence[int], prompt_topk: int = 0, *, chooser: TokenChooser | None = None,
        repetition_penalty: float = 1.0, reserve: int = 0, features: bool = False,
    ) -> tuple[StateT, int, Feedback | None]:
        """Run ``prompt``: the new sequence's state, its first pending token, and (with ``prompt_topk``)
        the model's top ids after every prompt token. ``reserve``: how many more tokens it may grow by;
        ``features``: hand over the model's features at every prompt position too (:class:`Feedback`)."""
        ...

    def verify(self, state: StateT, tree: DraftTree, topk: int = 0, features: bool = False) -> Verification:
        """One forward over ``tree`` after the committed tokens; commits the accepted path. ``features``:
        the feedback carries the model's features at every node, where the verifier can give them."""
        ...

    def rewind(self, state: StateT, committed_len: int) -> None:
        """Forget the committed tokens past ``committed_len``."""
        ...

    def release(self, state: StateT) -> None:
        """The sequence is over: what it holds may be freed, and it can no longer be verified."""
        ...


class TunableVerifier(Verifier[StateT], Protocol[StateT]):
    """A verifier that calibration times and the planner's memory keys on.

    ``buckets``: the tree sizes it runs forwards of, others padded up to the next (None: every
    size its own); :meth:`identity`: what a forward's cost depends on (the calibration and
    planner caches key on it). **Kernels** belong to the verifier: :meth:`kernel_variants`
    says which variants a forward of a size can run (calibration times each),
    :meth:`use_kernels` switches to a :class:`KernelChoice`, :attr:`kernels` is the choice in force.
    """

    @property
    def buckets(self) -> tuple[int, ...] | None: ...

    def identity(self) -> dict[str, str]:
        """What a verification's cost depends on, as strings: model architecture, dtype, device, backend, ..."""
        ...

    def weights_fingerprint(self) -> str:
        """A hash that tells two checkpoints of one architecture apart (the planner's statistics key on it)."""
        ...

    def warm_up(self, max_tokens: int) -> None:
        """Pay one-time costs (compiling, capturing) for sequences of up to ``max_tokens`` tokens now."""
        ...

    def close(self) -> None:
        """Done with the verifier: what it holds beyond its sequences (a static cache's captured graphs)
        may go to the model's next verifier. Idempotent."""
        ...

    def preserving(self) -> AbstractContextManager[None]:
        """A block whose prefills and verifications leave every live sequence as it was."""
        ...

    @property
    def kernels(self) -> KernelChoice: ...

    def kernel_variants(self, rows: int) -> tuple[str, ...]:
        """The kernel variants a forward over ``rows`` tokens can run and calibration should time, default first."""
        ...

    def use_kernels(self, choice: KernelChoice) -> None:
        """Run every later forward with the variant ``choice`` names for its size."""
        ...


@runtime_checkable
class BatchVerifier(Verifier[StateT], Protocol[StateT]):
    """A verifier that verifies many sequences' trees in one call (batched decoding, ``specdec.batching``).

    ``verify_batch(states, trees, topk)`` is ``[verify(s, t, topk) for s, t in zip(states, trees)]``
    in effect, each row's result exactly what verifying it alone gives; how it gets there is the
    verifier's (one forward over every row's tree on ``engine="specdec"``; one row after another
    on the model's own forward). ``live_limit``: how many sequences it can hold at once (None:
    as many as memory holds; a static cache holds one). ``row_bytes(tokens)``: the most bytes of
    KV cache one sequence of up to ``tokens`` tokens holds (None: unknown).
    """

    @property
    def live_limit(self) -> int | None: ...

    def verify_batch(self, states: Sequence[StateT], trees: Sequence[DraftTree], topk: int = 0,
                     features: bool = False) -> list[Verification]:  # fmt: skip
        """One verification per row (``states[b]`` with ``trees[b]``); commits each row's accepted path."""
        ...

    def row_bytes(self, tokens: int) -> int | None:
        """Peak KV-cache bytes of one sequence of up to ``tokens`` tokens (prompt, output and a tree's nodes)."""
        ...


@dataclass
class StepRecord:
    """One verification step, as the stats keep it."""

    tree_size: int
    accepted: int  # accepted draft tokens (root excluded); the step emitted accepted + 1
    source: str
    draft_s: float
    verify_s: float
    # The node source of each accepted draft node, when the tree labels its nodes (merged trees).
    accepted_sources: tuple[str, ...] | None = None
    # The draft budget (see specdec.budget): nodes the drafter offered before the budget cut
    # them to tree_size, why that size ("no draft", "declined": no draft could pay, "auto",
    # "probe", "fixed", "full"), the accepted draft tokens the acceptance model expected of
    # the verified tree, and the verification seconds the cost model predicted (None: no model).
    offered: int = 0
    reason: str = ""
    expected: float | None = None
    predicted_s: float | None = None
    # The whole step's wall seconds (drafting, verification, the drafter's update; calibration excluded)
    # and the sequences it advanced: a batched step (specdec.batching) is shared by its batch_rows rows,
    # each of whose records carries the same step_s; a lone sequence's steps have batch_rows == 1.
    step_s: float = 0.0
    batch_rows: int = 1


@dataclass
class GenerationStats:
    """Everything a run measures. Times are wall-clock seconds.

    ``steps`` counts target forwards after the prefill; ``mat`` (mean accepted tokens)
    is tokens emitted per step, bonus included, so plain decoding has ``mat == 1.0``.
    ``new_tokens`` is the output length (the prefill's token included, truncation applied).
    """

    prompt_tokens: int = 0
    new_tokens: int = 0
    steps: int = 0
    emitted_by_steps: int = 0
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    total_s: float = 0.0
    stop_reason: str = ""
    records: list[StepRecord] = field(default_factory=list)
    budget: str = ""  # "auto", "full" or a node count; "" when no budget planner ran
    calibration_s: float = 0.0  # one-time cost-model calibration inside this run (first use only)
    # what ran the model's forward (specdec.backends.ENGINES): "specdec", "hf", "compiled", ...; with
    # " (fell back to eager forwards)" where a compiled or captured forward failed its check (a warning said why)
    engine: str = ""

    @property
    def mat(self) -> float:
        """Mean accepted tokens per target forward (bonus included); 1.0 for plain decoding."""
        return self.emitted_by_steps / self.steps if self.steps else 0.0

    @property
    def other_s(self) -> float:
        """Wall time outside drafting, verification, prefill and calibration: the loop's own overhead."""
        return max(0.0, self.total_s - self.prefill_s - self.draft_s - self.verify_s - self.calibration_s)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.total_s if self.total_s > 0 else 0.0

    @property
    def accepted_histogram(self) -> dict[int, int]:
        """Steps by number of accepted draft tokens."""
        return dict(sorted(Counter(r.accepted for r in self.records).items()))

    @property
    def steps_by_source(self) -> dict[str, int]:
        return dict(Counter(r.source for r in self.records))

    @property
    def accepted_by_source(self) -> dict[str, int]:
        """Accepted draft tokens by the source that drafted them.

        A step whose tree labels its nodes (a merged tree) credits each accepted node to its
        own label (a node drafted by two sources is labelled ``"a&b"``); any other step
        credits all its accepted tokens to the step's source.
        """
        totals: Counter[str] = Counter()
        for r in self.records:
            if r.accepted_sources is not None:
                totals.update(r.accepted_sources)
            else:
                totals[r.source] += r.accepted
        return dict(totals)

    @property
    def mean_tree_size(self) -> float:
        return sum(r.tree_size for r in self.records) / len(self.records) if self.records else 0.0

    def budget_summary(self) -> dict[str, Any]:
        """What the draft budget did: nodes offered vs verified, expected vs realised acceptance.

        ``steps_by_reason``: why each step verified the nodes it did (``"declined"``: the
        draft was cut to the root alone, since no draft could pay); ``expected_accepted``
        and ``realised_accepted``: mean accepted draft tokens per step as the acceptance
        model predicted them and as they came (over the steps it predicted);
        ``predicted_verify_s`` vs ``measured_verify_s``: the cost model's total against the
        measured one (over the steps it predicted).
        """
        records = self.records
        expected = [r for r in records if r.expected is not None]
        expected_mean = sum(r.expected or 0.0 for r in expected) / len(expected) if expected else 0.0
        predicted = [r for r in records if r.predicted_s is not None]
        return {
            "budget": self.budget,
            "mean_offered": round(sum(r.offered for r in records) / len(records), 2) if records else 0.0,
            "steps_by_reason": dict(Counter(r.reason for r in records)),
            "expected_accepted": round(expected_mean, 3) if expected else None,
            "realised_accepted": round(sum(r.accepted for r in expected) / len(expected), 3) if expected else None,
            "predicted_verify_s": round(sum(r.predicted_s or 0.0 for r in predicted), 4) if predicted else None,
            "measured_verify_s": round(sum(r.verify_s for r in predicted), 4) if predicted else None,
            "calibration_s": round(self.calibration_s, 3),
        }

    def summary(self) -> dict[str, Any]:
        """A flat, JSON-friendly view."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "steps": self.steps,
            "mat": round(self.mat, 4),
            "tokens_per_s": round(self.tokens_per_s, 3),
            "mean_tree_size": round(self.mean_tree_size, 2),
            "prefill_s": round(self.prefill_s, 4),
            "draft_s": round(self.draft_s, 4),
            "verify_s": round(self.verify_s, 4),
            "other_s": round(self.other_s, 4),
            "total_s": round(self.total_s, 4),
            "stop_reason": self.stop_reason,
            "engine": self.engine,
            "accepted_histogram": self.accepted_histogram,
            "steps_by_source": self.steps_by_source,
            "accepted_by_source": self.accepted_by_source,
            **self.budget_summary(),
        }


@dataclass
class GenerationResult:
    """New token ids (the prompt excluded), their text when a tokenizer is known, and stats.

    ``seed`` is the sampling seed used (None for greedy decoding): pass it back to repeat a run.
    """

    tokens: list[int]
    stats: GenerationStats
    prompt_tokens: list[int]
    text: str | None = None
    seed: int | None = None
