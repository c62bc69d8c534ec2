"""vLLM's side of the ``custom_class`` proposer interface, replayed without vLLM.

:class:`BatchReplay` holds a batch as vLLM 0.32's GPU model runner does (``token_ids_cpu``
rows, ``num_tokens_no_spec``, the tokens each row sampled in its last step; rows that move
when the batch is condensed) and verifies drafts greedily against outputs known in
advance: a step accepts the longest prefix of a row's draft that the output continues
with, plus one bonus token, exactly what vLLM's greedy verification emits when the model's
output is that one. So a proposer can be run, checked and timed on real prompts and
outputs with no engine (``tests/test_vllm_integration.py``; the host cost in
``docs/serving.md``). The last output token is always a bonus, as when vLLM stops a
request at ``max_tokens``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from specdec.errors import SpecDecError


class BatchProposer(Protocol):
    """What vLLM calls (:class:`specdec.integrations.vllm.Proposer`)."""

    num_speculative_tokens: int
    max_model_len: int

    def propose(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: Any,
                token_ids_cpu: Any, slot_mappings: Any = None) -> list[list[int]]: ...


class BatchReplay:
    """A batch of requests whose outputs are known, verified greedily step by step."""

    def __init__(self, proposer: BatchProposer, max_rows: int = 8, max_len: int | None = None) -> None:
        self.proposer = proposer
        max_len = max_len or proposer.max_model_len
        self.token_ids = np.zeros((max_rows, max_len), dtype=np.int32)  # [rows, max_len], as token_ids_cpu
        self.lengths = np.zeros(max_rows, dtype=np.int32)  # [rows], as num_tokens_no_spec
        self.truth: list[list[int]] = []  # row -> prompt + the whole output
        self.sampled: list[list[int]] = []  # row -> the tokens its last step added
        self.accepted = 0  # draft tokens accepted so far
        self.reported = 0  # of those, the ones a later call showed the proposer (its row went on)
        self.steps = 0
        self.verified_tokens = 0  # tokens the target runs over: each live row's draft and its pending token
        self.propose_s = 0.0  # host seconds inside propose (wall clock)
        self.propose_cpu_s = 0.0  # the same in this thread's CPU time (steadier when other work shares the CPU)
        self.proposed_rows = 0  # rows with new tokens, summed over calls
        self._last_accepted: list[int] = []

    @property
    def num_rows(self) -> int:
        return len(self.truth)

    def add(self, prompt: Sequence[int], output: Sequence[int], row: int | None = None) -> int:
        """A request whose prefill chose ``output[0]``, in a new row or replacing ``row``'s request."""
        if not prompt or not output:
            raise SpecDecError("a replayed request needs a prompt and at least one output token")
        truth = [*map(int, prompt), *map(int, output)]
        max_len = self.token_ids.shape[1]
        if len(truth) > max_len:
            raise SpecDecError(f"prompt and output hold {len(truth)} tokens, more than max_len {max_len}")
        if row is None:
            if self.num_rows == len(self.lengths):
                raise SpecDecError(f"the batch is full ({self.num_rows} rows)")
            row = self.num_rows
            self.truth.append([])
            self.sampled.append([])
            self._last_accepted.append(0)
        self.truth[row] = truth
        self.token_ids[row, : len(prompt) + 1] = truth[: len(prompt) + 1]
        self.lengths[row] = len(prompt) + 1
        self.sampled[row] = [truth[len(prompt)]]
        self._last_accepted[row] = 0
        return row

    def context(self, row: int) -> list[int]:
        return [int(t) for t in self.token_ids[row, : self.lengths[row]]]

    @property
    def done(self) -> bool:
        return all(int(self.lengths[row]) >= len(self.truth[row]) for row in range(self.num_rows))

    def step(self) -> list[list[int]]:
        """``propose``, then one greedy verification of every row's draft; returns the drafts."""
        self.reported += sum(a for a, s in zip(self._last_accepted, self.sampled, strict=True) if s)
        self.proposed_rows += sum(1 for s in self.sampled if s)
        started, cpu_started = time.perf_counter(), time.thread_time()
        drafts = self.proposer.propose([list(s) for s in self.sampled], self.lengths, self.token_ids)
        self.propose_s += time.perf_counter() - started
        self.propose_cpu_s += time.thread_time() - cpu_started
        self.steps += 1
        if len(drafts) != self.num_rows:
            raise AssertionError(f"{len(drafts)} drafts for {self.num_rows} rows")
        for row, draft in enumerate(drafts):
            length, truth = int(self.lengths[row]), self.truth[row]
            if len(draft) > self.proposer.num_speculative_tokens or length + len(draft) > self.proposer.max_model_len:
                raise AssertionError(f"row {row}: a draft of {len(draft)} tokens at length {length}")
            self._last_accepted[row] = 0
            if length >= len(truth):  # finished: nothing new
                self.sampled[row] = []
                continue
            self.verified_tokens += len(draft) + 1
            accepted = 0
            while (accepted < len(draft) and length + accepted + 1 < len(truth)
                   and draft[accepted] == truth[length + accepted]):
                accepted += 1
            new = truth[length : length + accepted + 1]  # the accepted draft tokens and the bonus
            self.token_ids[row, length : length + len(new)] = new
            self.lengths[row] = length + len(new)
            # A request that reached its end leaves the batch's work: vLLM proposes nothing for it.
            self.sampled[row] = new if length + len(new) < len(truth) else []
            self.accepted += accepted
            self._last_accepted[row] = accepted
        return drafts

    def move(self, source: int, target: int) -> None:
        """vLLM's condense: row ``source`` (the last) fills row ``target`` and the batch shrinks."""
        if source != self.num_rows - 1:
            raise SpecDecError(f"condensing moves the last row ({self.num_rows - 1}), not row {source}")
        self.token_ids[target] = self.token_ids[source]
        self.lengths[target] = self.lengths[source]
        self.truth[target] = self.truth[source]
        self.sampled[target] = self.sampled[source]
        self._last_accepted[target] = self._last_accepted[source]
        del self.truth[source], self.sampled[source], self._last_accepted[source]

    def run(self, max_steps: int = 100_000) -> int:
        """Step until every request is done; returns the steps taken."""
        start = self.steps
        while not self.done:
            if self.steps - start >= max_steps:
                raise AssertionError(f"not done after {max_steps} steps")
            self.step()
        return self.steps - start
