"""Many prompts at once: the speculative decoding loop over a batch of rows, continuously refilled.

Each row is one prompt's :class:`~specdec.engine.LiveSequence` (its verifier state, pending
token, drafter, stop rules, token chooser and stats), exactly what :func:`specdec.engine.decode`
runs for a lone sequence, and every step is :func:`specdec.engine.step`, the step
:func:`~specdec.engine.decode` runs a lone sequence through as a batch of one. For ``B`` rows::

    drafting = planner.guard(B).drafts()                 # measured: whether drafting pays B rows at all
    price   = planner.plain_seconds_per_token(B)         # a plain step's seconds per token at B rows
    trees   = [row.draft(drafting and row.gate.drafts(price))   # each row's drafter (where its gate says
               for row in rows]                           #   drafting pays), pruned by its own rules and
                                                          #   the row's offer (batch_planner.ROW_OFFER_NODES)
    plan    = planner.plan(trees, committed)              # how many nodes each row verifies (one cost)
    results = verifier.verify_batch(states, plan.trees)   # one forward over every row's tree
    for row, result: row.learn(result); row.emit(result)  # each row's drafter, output and stop rules
    planner.guard(B).observe(drafting, tokens, seconds)    # the step's rate, as the kind of step it was

**Continuous batching.** A row that stops (EOS, a stop string, ``max_new_tokens``, the context)
is finished at once, its result handed out (:func:`decode_batch` yields ``(index, result)`` as
rows complete, in completion order), its cache released, and the next prompt takes its place
before the next step: a long list of prompts streams through ``batch_size`` places without
waiting for the slowest row of a group. When the list runs out, the batch shrinks as rows
finish, and each shrink gives the rows left fresh drafting gates (the planner's ``RowGate``: what
their drafting gained was priced at more rows); the last row offers its drafter's whole tree, as a
lone sequence does (``BatchPlanner.row_offer``). A joining row is prefilled alone (one prompt per
forward: the prefill's hundreds of rows are compute-bound, so batching prefills saves little
(docs/architecture.md, "Batch size"), and a lone prefill is bitwise a single-sequence run's).

**Lossless, row by row.** Every row decides its tokens from its own logits with its own chooser
(the position-keyed sampler: a row's draws depend on its seed and positions only), so its output
is its single-sequence output; on ``engine="specdec"`` the rows' logits are bitwise their lone
logits wherever specdec's CPU kernels run the forward (:mod:`specdec.backends.specdec_engine.forward`).

**Verifiers.** A :class:`~specdec.types.BatchVerifier` verifies all rows in one call
(``engine="specdec"``: one forward; a static cache's rows verifier,
:func:`~specdec.backends.buckets.rows.rows_bucket_verifier`, that a Generator on a static cache
batches with: one forward; the model's own forward, ``"dynamic"``: one row after another,
lossless but no faster than decoding the prompts in turn) and says how many sequences it holds
at once. A plain
:class:`~specdec.types.Verifier` is taken one row at a time.

**Memory.** Each live row holds its own KV cache (:meth:`~specdec.types.BatchVerifier.row_bytes`).
:func:`check_memory` runs before any work: if the ``batch_size`` largest rows' caches would take
more than :data:`MEMORY_SHARE` of the memory available on the model's device, it raises a
:class:`~specdec.errors.SpecDecError` that names the sizes and the largest batch size that fits.
Nothing is shrunk silently.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from specdec.budget.batch_planner import BatchPlanner, RowGate
from specdec.engine import BatchRequest, FinishedRow, LiveSequence, Row, reachable, step, tree_cap
from specdec.errors import SpecDecError
from specdec.types import BatchVerifier, Drafter, Verifier

MEMORY_SHARE = 0.8  # the most of the device's available memory a batch's KV caches may take


def live_limit(verifier: Verifier[Any]) -> int | None:
    """How many sequences ``verifier`` holds at once: a batch verifier says; a plain verifier, one."""
    return verifier.live_limit if isinstance(verifier, BatchVerifier) else 1


def batch_places(verifier: Verifier[Any], batch_size: int) -> int:
    """How many rows a batch of ``batch_size`` runs at once on ``verifier``: no more than it holds."""
    limit = live_limit(verifier)
    return batch_size if limit is None else min(batch_size, limit)


def check_memory(
    verifier: Verifier[Any], requests: Sequence[BatchRequest], batch_size: int, available: int | None
) -> int | None:
    """The peak bytes of the batch's KV caches (None: unknown); raises before any work if they do not fit.

    A row's peak is :meth:`~specdec.types.BatchVerifier.row_bytes` of its prompt, its
    ``max_new_tokens`` and its largest tree; the batch's, the sum of its ``batch_size``
    largest rows (any of them may be live together), or ``batch_size`` times the largest where
    every place is as large as the largest row's (a verifier whose forward has ``regions_alike``: one static
    cache cut into equal regions, :mod:`specdec.backends.buckets.rows`). Raises :class:`SpecDecError` when that is
    more than :data:`MEMORY_SHARE` of ``available`` bytes, naming the largest batch size that fits.
    """
    if not isinstance(verifier, BatchVerifier) or not requests:
        return None
    places = batch_places(verifier, batch_size)
    sizes = []
    for request in requests:
        tokens = (len(request.prompt) + reachable(request.config, verifier, len(request.prompt))
                  + tree_cap(request.config, verifier))
        size = verifier.row_bytes(tokens)
        if size is None:
            return None
        sizes.append(size)
    largest = sorted(sizes, reverse=True)
    if getattr(getattr(verifier, "forward", None), "regions_alike", False):
        largest = [largest[0]] * len(largest)
    peak = sum(largest[:places])
    if available is None or peak <= MEMORY_SHARE * available:
        return peak
    fits, total = 0, 0
    for size in largest:
        if total + size > MEMORY_SHARE * available:
            break
        fits, total = fits + 1, total + size
    mib = 2**20
    advice = f"pass batch_size={fits} or less" if fits else "not even one row fits: free memory or shorten the rows"
    raise SpecDecError(
        f"a batch of {places} rows needs up to {peak / mib:.0f} MiB of KV cache ({largest[0] / mib:.0f} MiB for its "
        f"largest row), more than {MEMORY_SHARE:.0%} of the {available / mib:.0f} MiB available on "
        f"{verifier.description.device}: {advice}"
    )


def decode_batch(
    verifier: Verifier[Any],
    requests: Iterable[BatchRequest],
    new_drafter: Callable[[], Drafter],
    *,
    batch_size: int,
    planner: BatchPlanner | None = None,
) -> Iterator[FinishedRow]:
    """Decode every request, ``batch_size`` rows at a time, refilled as rows finish (module docstring).

    ``new_drafter()`` gives each row its own drafter; ``planner`` decides each step's trees for
    the whole batch (None: every tree as its drafter and ``max_nodes`` leave it). Yields each row
    as it completes. Per row, ``stats.verify_s`` is the batch's verification time (the row waited
    for all of it), ``stats.draft_s`` the row's own drafting plus the batch's planning, and
    ``stats.other_s`` what it waited for the other rows (their drafting, joining rows' prefills).
    """
    places = batch_places(verifier, batch_size)
    budget = "" if planner is None else str(planner.budget)
    offer = None if planner is None else planner.row_offer(places)  # the most nodes a row asks its drafter for
    queue = iter(requests)
    rows: list[Row] = []  # each with its gate: whether its drafting pays (batch_planner.RowGate)
    drained = False  # no request is left: a finished row's place stays empty from now on
    last_rows = 0  # how many rows the last step had
    try:
        while True:
            while not drained and len(rows) < places:  # continuous batching: finished rows' places go to the next
                request = next(queue, None)
                if request is None:
                    drained = True
                    break
                sequence = LiveSequence(verifier, new_drafter(), request.prompt, request.config, budget=budget)
                if offer is not None:
                    sequence.cap = min(sequence.cap, offer)
                if sequence.stop is not None:  # the prefill's token ended it
                    yield FinishedRow(request.index, sequence.finish(), sequence.drafter)
                    continue
                rows.append(Row(request, sequence, RowGate()))
            if not rows:
                return
            if drained and len(rows) < last_rows:  # the batch shrank for good (the tail): what its rows do is decided
                for row in rows:  # afresh, at the rows left
                    row.gate = RowGate()
                if offer is not None and planner is not None:  # a lone row offers what a lone sequence does
                    left = planner.row_offer(len(rows))
                    for row in rows:
                        full = tree_cap(row.request.config, verifier)
                        row.sequence.cap = full if left is None else min(full, left)
            last_rows = len(rows)
            yield from step(verifier, rows, planner)
    finally:  # the caller stopped early (or a step raised): the live rows' caches go now
        for row in rows:
            if not row.sequence.finished:
                verifier.release(row.sequence.state)
