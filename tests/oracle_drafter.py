"""A test drafter that knows the right answer and hides it in random trees.

Given the plain-decoding output, it drafts trees whose true path (often cut short, or
broken by a wrong token) sits among random distractor branches, in a random topological
order, so acceptance walks long paths and KV compaction gathers scattered slots.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from specdec.types import DraftTree, Feedback


def random_tree(rng: random.Random, root: int, vocab: int, size: int, path: Sequence[int] = ()) -> DraftTree:
    """A random tree of about ``size`` nodes containing ``path`` below the root, shuffled topologically."""
    tokens, parents = [root], [-1]
    children: list[dict[int, int]] = [{}]

    def add(parent: int, token: int) -> int:
        if token in children[parent]:
            return children[parent][token]
        tokens.append(token)
        parents.append(parent)
        children.append({})
        children[parent][token] = len(tokens) - 1
        return len(tokens) - 1

    node = 0
    for token in path:
        node = add(node, token)
    while len(tokens) < size:
        add(rng.randrange(len(tokens)), rng.randrange(vocab))
    # Random topological order: place any node whose parent is already placed.
    order, placed, ready = [], {}, [0]
    kids: list[list[int]] = [[] for _ in tokens]
    for i in range(1, len(tokens)):
        kids[parents[i]].append(i)
    while ready:
        i = ready.pop(rng.randrange(len(ready)))
        placed[i] = len(order)
        order.append(i)
        ready.extend(kids[i])
    return DraftTree(
        tuple(tokens[i] for i in order), tuple(-1 if i == 0 else placed[parents[i]] for i in order), source="oracle"
    )


class OracleTreeDrafter:
    """Drafts random trees around the known plain-decoding output ``truth``."""

    name = "oracle"
    feedback_topk = 0

    def __init__(self, truth: Sequence[int], vocab: int, seed: int = 0, size: int = 16, depth: int = 6) -> None:
        self.truth = list(truth)
        self.vocab = vocab
        self.rng = random.Random(seed)
        self.size = size
        self.depth = depth
        self.position = 0  # index in truth of the pending token

    def reset(self, prompt: Sequence[int], feedback: Feedback | None = None) -> None:
        self.position = 0

    def propose(self, pending: int, max_nodes: int) -> DraftTree:
        assert pending == self.truth[self.position], (pending, self.truth[self.position])
        path = self.truth[self.position + 1 : self.position + 1 + self.rng.randrange(self.depth + 1)]
        if path and self.rng.random() < 0.3:  # break the path with a wrong token
            cut = self.rng.randrange(len(path))
            path = [*path[:cut], (path[cut] + 1 + self.rng.randrange(self.vocab - 1)) % self.vocab]
        size = self.rng.randrange(1, self.size + 1)
        return random_tree(self.rng, pending, self.vocab, max(size, len(path) + 1), path).prefix(max_nodes)

    def update(self, accepted: Sequence[int], feedback: Feedback | None) -> None:
        assert list(accepted) == self.truth[self.position : self.position + len(accepted)]
        self.position += len(accepted)


class OracleTreeFactory:
    """Oracle drafters for many prompts at once (a batch's rows): each looks up its prompt's truth at reset."""

    name = "oracle"

    def __init__(self, truths: Mapping[tuple[int, ...], Sequence[int]], vocab: int, seed: int = 0, size: int = 16,
                 depth: int = 6) -> None:
        self.truths, self.vocab, self.seed, self.size, self.depth = truths, vocab, seed, size, depth
        self.made = 0

    def create(self) -> OracleTreeDrafter:
        self.made += 1
        return _KeyedOracle(self.truths, self.vocab, self.seed + self.made, self.size, self.depth)


class _KeyedOracle(OracleTreeDrafter):
    def __init__(self, truths: Mapping[tuple[int, ...], Sequence[int]], vocab: int, seed: int, size: int,
                 depth: int) -> None:
        super().__init__((), vocab, seed, size, depth)
        self.truths = truths

    def reset(self, prompt: Sequence[int], feedback: Feedback | None = None) -> None:
        self.truth = list(self.truths[tuple(prompt)])
        super().reset(prompt, feedback)
