"""The keyword options of :func:`specdec.run` and :func:`specdec.generate`: the :class:`~specdec.Generator`'s
and the decoding options (docs/usage.md describes each), told apart by :func:`split_options`."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, TypedDict

from specdec.decoding import DECODING_OPTIONS, DecodingOptions
from specdec.errors import SpecDecError


class GeneratorOptions(TypedDict, total=False):
    """The :class:`~specdec.Generator` options that ``run`` and ``generate`` take too (docs/usage.md describes each)."""

    drafter_options: Mapping[str, Any] | None
    engine: str
    datastore: str | os.PathLike[str] | None
    store: Any
    device: Any
    dtype: Any
    planner_cache: bool | None
    backend: str  # deprecated: tree_ops= of Generator (tests, benchmarks)
    cache: str  # deprecated: engine=


class RunOptions(GeneratorOptions, DecodingOptions, total=False):
    """Every keyword option of ``run`` and ``generate``: the Generator's, the decoding options, and these."""

    tokenizer: Any
    on_tokens: Callable[[list[int]], None] | None


GENERATOR_OPTIONS = frozenset(GeneratorOptions.__optional_keys__)


def split_options(
    options: Mapping[str, Any], function: str, *, streams: bool = True
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(Generator options, decoding options)`` of ``run``/``generate`` keywords; an unknown one is a TypeError.
    ``streams=False`` (``run_batch``): an ``on_tokens`` callback is refused."""
    if not streams and options.get("on_tokens") is not None:
        raise SpecDecError(f"{function} does not stream tokens: use Generator.iter_batch for results as rows complete")
    unknown = sorted(set(options) - GENERATOR_OPTIONS - DECODING_OPTIONS - {"tokenizer", "on_tokens"})
    if unknown:
        raise TypeError(f"{function}() got an unexpected keyword argument {unknown[0]!r}")
    return ({k: v for k, v in options.items() if k in GENERATOR_OPTIONS},
            {k: v for k, v in options.items() if k in DECODING_OPTIONS})
