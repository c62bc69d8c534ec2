"""Drafters driven by a known token stream instead of a model: costs and acceptance, no forwards.

A **replay** pretends the target model would emit exactly ``stream`` after its first
``prompt_len`` tokens (teacher forcing). Each step the drafter proposes a tree rooted at
the pending token ``stream[i]``; the "model" choice at a node whose path from the root
spells ``stream[i : i + d + 1]`` is the stream's next token ``stream[i + d + 1]``, and
elsewhere a fixed pseudo-random token (:func:`off_path_choice`). The walk, the bonus and
the feedback then follow the same rules as :class:`~specdec.backends.verifier.ModelVerifier`.
:class:`ReplayVerifier` answers the engine as a verifier would, so :func:`replay` runs the
real loop, :func:`specdec.engine.decode`, with the real drafter, at a cost of microseconds
per step instead of a forward.

What it is for: timing a drafter's own work per step (propose + update) and the loop's
own overhead on realistic text and trees, and a machine-independent acceptance figure
for drafter changes. It is not the model's acceptance: a real model departs from any
fixed text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from specdec.errors import SpecDecError
from specdec.types import Drafter, DraftTree, Feedback, GenerationResult, Verification

if TYPE_CHECKING:
    from specdec.backends.verifier import ModelVerifier

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
    children = tree.children()
    node, path = 0, [0]
    while (child := children[node].get(choices[node])) is not None:
        path.append(child)
        node = child
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
    """A verifier whose "model" emits ``stream``: :func:`specdec.engine.decode` runs unchanged over it.

    It answers what :class:`~specdec.backends.verifier.ModelVerifier` answers (prefill,
    verify, ``context_length``) by the rule in the module docstring, so a decode over it
    is the real loop with the real drafter, and its output is ``stream`` after the prompt.
    ``context_length`` is the stream's length minus one, so no node is drafted past the
    last token whose successor is known.
    """

    name = "replay"

    def __init__(self, stream: Sequence[int], vocab_size: int) -> None:
        if len(stream) < 2:
            raise SpecDecError(f"a replay needs a stream of at least 2 tokens, got {len(stream)}")
        self.stream = [int(t) for t in stream]
        self.vocab_size = vocab_size
        self.context_length = len(self.stream) - 1

    def prefill(self, prompt: Sequence[int], prompt_topk: int = 0, **options: Any) -> tuple[ReplayState, int, Any]:
        """The pending token after ``prompt`` (which must be the stream's beginning); ``options`` are ignored."""
        length = len(prompt)
        if not 1 <= length < len(self.stream) or list(prompt) != self.stream[:length]:
            raise SpecDecError(f"a replay's prompt must be the stream's first 1 to {len(self.stream) - 1} tokens")
        feedback = None
        if prompt_topk:
            choices = np.asarray(self.stream[1 : length + 1], dtype=np.int64)[:, None]  # [L, 1]
            ranks = np.arange(prompt_topk, dtype=np.int64)[None, :]  # [1, k]
            feedback = Feedback(np.asarray(prompt, dtype=np.int64), (choices + ranks) % self.vocab_size)
        return ReplayState(length), self.stream[length], feedback

    def verify(self, state: ReplayState, tree: DraftTree, topk: int = 0) -> Verification:
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
    from specdec.engine import StopRules, decode

    if not 1 <= prompt_len < len(stream):
        raise SpecDecError(f"prompt_len must be in [1, {len(stream) - 1}] for a stream of {len(stream)}, "
                           f"got {prompt_len}")
    verifier = ReplayVerifier(stream, vocab_size)
    rules = StopRules(max_new_tokens=len(stream) - prompt_len)
    # decode() takes a ModelVerifier; it uses only prefill, verify and context_length, which
    # ReplayVerifier provides with the same meaning.
    result = decode(cast("ModelVerifier", verifier), drafter, verifier.stream[:prompt_len], rules,
                    max_nodes=max_nodes, prompt_feedback=drafter.feedback_topk > 0)
    if result.tokens != verifier.stream[prompt_len:]:
        raise SpecDecError("the replayed output differs from the stream: the loop or the replay is wrong")
    return result
