"""``drafter="eagle"``: a draft tree grown by an EAGLE head over the target's features (EAGLE-2's dynamic tree).

EAGLE (Li et al., 2024) drafts with a small head that reads the target's features
(:mod:`specdec.drafters.eagle_head` defines the head and its symbols: ``f_t``, ``e_{t+1}``, the
head's output ``f^_{t+1}`` and its draft logits). EAGLE-2 (Li et al., *EAGLE-2: Faster Inference of
Language Models with Dynamic Draft Trees*, 2024) grows the tree by the head's confidence: a node's
**score** is the sum of the draft log-probabilities along its path (its cumulative confidence,
which tracks its chance of being accepted).

**The head's state.** The head keeps its own KV cache (a transformers ``DynamicCache`` of its one
layer) over **context pairs**: pair ``j`` is ``(f_j, x_{j+1})`` at position ``j``, for every committed
position ``j`` whose next token is committed too. The
features come from the verifier (the drafter's ``feedback_features``: every prompt position at
reset, every verified node after a step, :class:`~specdec.types.Feedback`); drafters never see the
model's forward. Where the verifier's forward hands over none (the fixed-shape buckets), the
drafter computes them itself with the target's forward over the committed tokens (one more target
forward per step: lossless, slower). Context pairs are never taken back (committed tokens stay
committed), so the cache only grows; a proposal's root pair (``f_{C-1}``, the pending token) and tree
pairs are cropped off when it ends, the root pair fed again with the next proposal's new pairs.

**Growing the tree** (``topk`` = k, ``depth`` = D, ``num_nodes`` = N), one head forward per depth:

1. the context pairs not yet cached and the **root pair** ``(f_{C-1}, pending)`` in one forward (``C``
   committed tokens); the root pair's output gives the root's top-k children, scored by log-probability;
2. at each depth ``d = 2..D``, the **frontier**, the k best nodes of the previous depth by score, runs
   through the head in one forward (each node's pair: its parent's predicted feature and its own
   token, at position ``C - 1 + depth``; a tree mask lets it see the context and its ancestors); each
   frontier node's top-k children join the candidates (score: the parent's plus the child's log-probability);
3. **rerank**: the N - 1 best candidates by score. A child never scores above its parent, so they
   form a tree (ties: the earlier-made first, and parents are made first); listed best first, so a
   node budget cuts the best prefix (:meth:`~specdec.types.DraftTree.prefix`).

Every node carries ``feature`` = its path probability in halvings (``floor(-score / ln 2)``, at most 15):
the budget planner learns acceptance per feature, so ``budget="auto"`` prices EAGLE's confidence,
and the time the head takes counts as drafting time, which the planner weighs every step. Siblings
are a top-k, hence distinct tokens. Cost per proposal: D head forwards over at most k rows
(the first over the new context pairs), each a decoder layer and a ``[V_d, H]`` LM head.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from specdec.drafters.base import DrafterContext, Factory, parse_options, require_positive
from specdec.drafters.eagle_head import DEFAULT_HEAD, EagleHead, load_head
from specdec.errors import SpecDecError
from specdec.types import DrafterFactory, DraftTree, Feedback

MAX_FEATURE = 15
DTYPES = ("auto", "target", "float32", "bfloat16", "float16", "float64")


@dataclass(frozen=True)
class EagleConfig:
    """``head``: the head file (``"default"``: the one shipped for the default model) or an
    :class:`~specdec.drafters.eagle_head.EagleHead`; ``topk``: children per expanded node and frontier
    width; ``depth``: the tree's deepest level; ``num_nodes``: the tree's nodes, root included; ``dtype``:
    what the head computes in (a head file's; an ``EagleHead`` keeps its own): ``"auto"`` (bfloat16 for a
    float32 target on a CPU with BF16 dot products, where its small products run ~3x faster, else the
    target's), ``"target"``, or a dtype's name."""

    head: Any = "default"
    topk: int = 8
    depth: int = 6
    num_nodes: int = 48
    dtype: str = "auto"

    def __post_init__(self) -> None:
        require_positive("eagle", topk=self.topk, depth=self.depth, num_nodes=self.num_nodes)
        if self.dtype not in DTYPES:
            raise SpecDecError(f"drafter 'eagle': dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")

    def head_dtype(self, model: Any) -> torch.dtype | None:
        """The dtype the head computes in for target ``model`` (None: the target's)."""
        if self.dtype == "target":
            return None
        if self.dtype != "auto":
            dtype: torch.dtype = getattr(torch, self.dtype)
            return dtype
        weight = model.get_output_embeddings().weight
        fast = weight.device.type == "cpu" and torch.ops.mkldnn._is_mkldnn_bf16_supported()
        return torch.bfloat16 if weight.dtype == torch.float32 and fast else None


class TargetFeatures:
    """The target's features of the committed tokens, computed with its own forward (where the verifier
    hands over none): a ``DynamicCache`` of the committed tokens, fed what is new at each call."""

    def __init__(self, model: Any) -> None:
        from specdec.models import cache_keyword  # imports transformers: at first use

        self.model = model
        self.keyword = cache_keyword(model)
        self.cache: Any = None
        self.fed = 0

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache, self.fed = DynamicCache(), 0

    def features(self, committed: Sequence[int]) -> torch.Tensor:
        """The features ``[len(committed) - fed, H]`` of the committed tokens not fed before."""
        from specdec.models import returned_cache

        device = next(self.model.parameters()).device
        ids = torch.tensor([list(committed[self.fed :])], dtype=torch.long, device=device)
        out = self.model(input_ids=ids, use_cache=True, output_hidden_states=True, logits_to_keep=1,
                         **{self.keyword: self.cache})  # fmt: skip
        self.cache = returned_cache(out)
        self.fed = len(committed)
        hidden: torch.Tensor = out.hidden_states[-1][0]  # after the final norm (transformers 5)
        return hidden


class EagleDrafter:
    """Drafts EAGLE-2's dynamic tree (module docstring) with ``head`` and a cache in step with the committed tokens."""

    name = "eagle"
    feedback_topk = 0
    feedback_features = True

    def __init__(self, head: EagleHead, config: EagleConfig, fallback: TargetFeatures | None = None) -> None:
        self.head = head
        self.config = config
        self.fallback = fallback
        self.vocab = [int(t) for t in head.draft_vocab.tolist()]  # draft-vocabulary index -> token id
        parameter = head.fc.weight
        self.dtype, self.device = parameter.dtype, parameter.device
        self.committed: list[int] = []
        self.waiting: list[torch.Tensor] = []  # features [n, H] of committed positions not yet in a pair
        self.known = 0  # committed positions whose features are in `waiting` or were fed
        self.fed = 0  # context pairs in the head's cache
        self.cache: Any = None

    def reset(self, prompt: Sequence[int], feedback: Feedback | None = None) -> None:
        from transformers import DynamicCache

        self.committed = [int(t) for t in prompt]
        self.waiting, self.known, self.fed = [], 0, 0
        self.cache = DynamicCache()
        if self.fallback is not None:
            self.fallback.reset()
        self._take(feedback, None)

    def update(self, accepted: Sequence[int], feedback: Feedback | None) -> None:
        self.committed.extend(int(t) for t in accepted)
        self._take(feedback, feedback.accepted_nodes if feedback is not None else ())

    @torch.inference_mode()  # the verifier's features are inference tensors
    def _take(self, feedback: Feedback | None, rows: Sequence[int] | None) -> None:
        """Keep the features of the newly committed positions (``rows`` of the feedback; None: all of them)."""
        features = None if feedback is None else feedback.features
        if features is None:
            return  # none handed over: propose computes them (fallback) or drafts nothing
        if self.known != len(self.committed) - (features.shape[0] if rows is None else len(rows)):
            return  # a gap (an earlier step came without features): the fallback fills it, from `known`
        taken = features if rows is None else features[list(rows)]
        self.waiting.append(taken.to(self.dtype))
        self.known = len(self.committed)

    def _catch_up(self) -> bool:
        """Bring ``known`` to the committed length by the fallback; False when that cannot be done."""
        if self.known == len(self.committed):
            return True
        if self.fallback is None:
            return False
        if self.fallback.fed != self.known:  # the fallback's cache must start where the known features end
            self.fallback.reset()
            from transformers import DynamicCache

            self.waiting, self.known, self.fed = [], 0, 0
            self.cache = DynamicCache()
        self.waiting.append(self.fallback.features(self.committed).to(self.dtype))
        self.known = len(self.committed)
        return True

    def _mask(self, allowed: torch.Tensor) -> torch.Tensor:
        """An additive mask ``[1, 1, q, kv]`` from bool ``allowed`` ``[q, kv]``."""
        blocked = torch.finfo(self.dtype).min
        zeros = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
        return zeros.masked_fill(~allowed, blocked)[None, None]

    def _run(self, features: torch.Tensor, tokens: Sequence[int], positions: Sequence[int],
             allowed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """The head over new pairs (``features`` ``[q, H]``, ``tokens`` ``[q]``, bool ``allowed`` ``[q, kv]``):
        the predicted features ``[q, H]`` and their draft log-probabilities float32 ``[q, V_d]``."""
        ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.device)
        where = torch.tensor([list(positions)], dtype=torch.long, device=self.device)
        predicted = self.head(features[None], ids, where, self._mask(allowed), self.cache)[0]  # [q, H]
        return predicted, torch.log_softmax(self.head.logits(predicted).float(), dim=-1)

    @torch.inference_mode()
    def propose(self, pending: int, max_nodes: int) -> DraftTree:
        nodes = min(self.config.num_nodes, max_nodes)
        if nodes < 2 or not self.committed or not self._catch_up():
            return DraftTree.single(pending, self.name)
        context = len(self.committed)  # C: pairs 0..C-1 once the root pair is in
        new_tokens = [*self.committed[self.fed + 1 :], pending]  # x_{j+1} of pairs fed..C-1
        features = torch.cat(self.waiting) if len(self.waiting) > 1 else self.waiting[0]  # [C - fed, H]
        q = context - self.fed
        allowed = torch.ones(q, self.fed + q, dtype=torch.bool, device=self.device).tril(self.fed)
        predicted, logp = self._run(features, new_tokens, range(self.fed, context), allowed)
        # The root pair is fed again by the next proposal (its pending token may differ then: a proposal with no
        # update between); the pairs before it are the committed context's and stay.
        self.waiting, self.fed = [features[-1:]], context - 1
        try:
            return self._grow(pending, logp[-1:], predicted[-1:], context, nodes)  # from the root pair's output
        finally:
            extra = int(self.cache.get_seq_length()) - self.fed
            self.cache.crop(-extra)  # the root's and the tree's pairs go (a negative count: transformers 5.0-5.24)

    def _grow(self, pending: int, root_logp: torch.Tensor, root_feature: torch.Tensor, context: int,
              nodes: int) -> DraftTree:  # fmt: skip
        """EAGLE-2's expansion and rerank (module docstring, steps 1-3), after the root pair's forward."""
        k, vocab = min(self.config.topk, len(self.vocab)), self.vocab
        # Candidates, in the order made: parent (index into these lists, -1: the root), token, score.
        parents: list[int] = []
        tokens: list[int] = []
        scores: list[float] = []
        slot: dict[int, int] = {}  # candidate -> its pair's slot in the head cache (expanded nodes only)
        top = torch.topk(root_logp[0], k)
        for value, index in zip(top.values.tolist(), top.indices.tolist(), strict=True):
            parents.append(-1)
            tokens.append(vocab[index])
            scores.append(value)
        frontier = list(range(k))
        inputs = root_feature.expand(k, -1)  # each frontier node's pair reads its parent's predicted feature
        for depth in range(2, self.config.depth + 1):
            cached = int(self.cache.get_seq_length())
            rows = len(frontier)
            allowed = torch.zeros(rows, cached + rows, dtype=torch.bool, device=self.device)
            allowed[:, :context] = True
            for row, node in enumerate(frontier):
                ancestor = parents[node]
                while ancestor >= 0:
                    allowed[row, slot[ancestor]] = True
                    ancestor = parents[ancestor]
                allowed[row, cached + row] = True
                slot[node] = cached + row
            predicted, logp = self._run(inputs, [tokens[n] for n in frontier], [context - 2 + depth] * rows, allowed)
            top = torch.topk(logp, k, dim=-1)
            children = []
            for row, node in enumerate(frontier):
                base = scores[node]
                for value, index in zip(top.values[row].tolist(), top.indices[row].tolist(), strict=True):
                    children.append(len(tokens))
                    parents.append(node)
                    tokens.append(vocab[index])
                    scores.append(base + value)
            best = sorted(children, key=lambda c: (-scores[c], c))[:k]
            frontier = best
            inputs = predicted[[frontier_row(c, parents, slot, cached) for c in best]]
        chosen = sorted(range(len(tokens)), key=lambda c: (-scores[c], c))[: nodes - 1]
        where = {c: i + 1 for i, c in enumerate(chosen)}
        return DraftTree(
            (pending, *(tokens[c] for c in chosen)),
            (-1, *(0 if parents[c] < 0 else where[parents[c]] for c in chosen)),
            self.name,
            node_features=(0, *(min(MAX_FEATURE, int(-scores[c] / math.log(2))) for c in chosen)),
        )


def frontier_row(child: int, parents: Sequence[int], slot: Mapping[int, int], cached: int) -> int:
    """The row of the last head forward that predicted ``child``'s feature input: its parent's row."""
    return slot[parents[child]] - cached


def default_head_path() -> Path:
    """The head shipped for the default model (``specdec/data``)."""
    return Path(str(resources.files("specdec").joinpath(DEFAULT_HEAD)))


def eagle_factory(options: Mapping[str, Any], context: DrafterContext) -> DrafterFactory:
    config = parse_options(EagleConfig, "eagle", options)
    model = context.model
    if model is None:
        raise SpecDecError(
            "drafter 'eagle' reads the target's embeddings, final norm and LM head, and this caller gave no target "
            "model (DrafterContext.model); use it through specdec.run or Generator"
        )
    if isinstance(config.head, EagleHead):
        head = config.head
    elif isinstance(config.head, (str, Path)):
        path = default_head_path() if config.head == "default" else Path(config.head)
        head = load_head(path, model, config.head_dtype(model))  # checked here, shared by every drafter (no state)
    else:
        raise SpecDecError(f"drafter 'eagle': head must be a head file, 'default' or an EagleHead, "
                           f"got {type(config.head).__name__}")  # fmt: skip
    fallback = model
    return Factory("eagle", lambda: EagleDrafter(head, config, TargetFeatures(fallback)))
