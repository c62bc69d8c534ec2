"""The rows of a batch (:meth:`specdec.Generator.iter_batch`): the arguments checked, every prompt's
token ids checked against the model, each row's own decoding config (its sampling seed), and the
verifier the batch runs on (:class:`BatchVerifiers`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from specdec.backends.engines import row_of
from specdec.backends.verifier import ModelVerifier
from specdec.coercion import Prompt, prompt_ids
from specdec.decoding import DecodingConfig
from specdec.engine import BatchRequest
from specdec.errors import SpecDecError

DEFAULT_BATCH_SIZE = 8


def check_batch(prompts: Sequence[Prompt], batch_size: int) -> None:
    """Refuse what is not a list of prompts, or a batch size that is not a positive int."""
    if isinstance(prompts, str) or not isinstance(prompts, Sequence):
        raise SpecDecError("a batch takes a list of prompts (text, token ids or chat messages)")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise SpecDecError(f"batch_size must be a positive int, got {batch_size!r}")


def prompt_rows(
    prompts: Sequence[Prompt], tokenizer: Any, config: DecodingConfig, limit: int | None, vocab: int
) -> list[list[int]]:
    """Every prompt's token ids, each checked against the vocabulary (``vocab`` ids) and the context
    (``limit`` tokens, None: unbounded); errors name the prompt's index."""
    batch = []
    for index, prompt in enumerate(prompts):
        try:
            ids = prompt_ids(prompt, tokenizer, config.chat_template)
        except SpecDecError as error:
            raise SpecDecError(f"prompt {index}: {error}") from None
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise SpecDecError(f"prompt {index}: token id {bad} is outside the model's vocabulary [0, {vocab})")
        if limit is not None and len(ids) > limit:
            raise SpecDecError(f"prompt {index} has {len(ids)} tokens, past the model's context length of {limit}")
        batch.append(ids)
    return batch


def row_configs(
    config: DecodingConfig, count: int, seeds: Sequence[int] | None, options: Mapping[str, Any]
) -> list[DecodingConfig]:
    """Each row's config: ``config`` with the row's own sampling seed (:meth:`specdec.Generator.iter_batch`)."""
    if seeds is not None:
        if options.get("seed") is not None:
            raise SpecDecError("give seed= (row i samples with seed + i) or seeds= (one per prompt), not both")
        if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence) or len(seeds) != count or any(
            isinstance(s, bool) or not isinstance(s, int) for s in seeds
        ):  # fmt: skip
            raise SpecDecError(f"seeds must be a list of {count} ints (one per prompt), got {seeds!r}")
        row_seeds: list[int | None] = list(seeds)
    else:
        base = config.decision.seed
        row_seeds = [None if base is None else base + index for index in range(count)]
    return [config if seed is None else dataclasses.replace(config, decision=config.decision.with_seed(seed))
            for seed in row_seeds]  # fmt: skip


def batch_requests(
    prompts: Sequence[Prompt], batch_size: int, seeds: Sequence[int] | None, options: Mapping[str, Any],
    config: DecodingConfig, tokenizer: Any, verifier: ModelVerifier,
) -> list[BatchRequest]:
    """Every prompt's row, all checked (:func:`check_batch`, :func:`prompt_rows` against ``verifier``'s
    model), each with its own config (:func:`row_configs`), indexed in prompt order."""
    check_batch(prompts, batch_size)
    ids = prompt_rows(prompts, tokenizer, config, verifier.context_length, verifier.vocab_size)
    configs = row_configs(config, len(prompts), seeds, options)
    return [BatchRequest(index, row_ids, row_config)
            for index, (row_ids, row_config) in enumerate(zip(ids, configs, strict=True))]  # fmt: skip


class BatchVerifiers:
    """The verifiers a generator's batches run on, by their places (batch size).

    A batch runs on the generator's own ``verifier``; where that holds one sequence (a static
    cache), on the one its engine's row makes for a batch (``batch`` of
    :data:`~specdec.backends.engines.TABLE`: made at the first batch of that size, closed by
    :meth:`close` with the generator), which verifies every row in one forward.
    """

    def __init__(self, verifier: ModelVerifier) -> None:
        self.verifier = verifier
        self.made: dict[int, ModelVerifier] = {}  # the rows verifiers made, by places

    def get(self, batch_size: int) -> ModelVerifier:
        """The verifier a batch of ``batch_size`` places runs on."""
        row = row_of(self.verifier)
        if batch_size < 2 or row is None or row.batch is None:
            return self.verifier
        rows = self.made.get(batch_size)
        if rows is None:
            rows = self.made[batch_size] = row.batch(self.verifier, batch_size)
        return rows

    def close(self) -> None:
        """Close every rows verifier made (the generator's own verifier is the generator's to close)."""
        for rows in self.made.values():
            rows.close()
