"""Pieces shared by the production drafters: the factory type and option checking."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from specdec.budget.acceptance import AcceptanceModel
from specdec.cachefiles import TokenizerIdentity
from specdec.datastores.shared_store import SharedStore
from specdec.drafters.recycling_state import SharedMatrices
from specdec.errors import SpecDecError
from specdec.types import Drafter

ConfigT = TypeVar("ConfigT")


@dataclass
class DrafterContext:
    """What a drafter factory may know of the target and of its caller.

    ``vocab_size``, ``tokenizer``, ``eos_token_ids``: the target's. Datastore-backed drafters
    check their file against :meth:`tokenizer_identity` (a hash of the vocabulary, computed
    on first use, ~50 ms) or, with no tokenizer, ``vocab_size``. ``store``: the caller's
    store of earlier sequences (a :class:`~specdec.datastores.shared_store.SharedStore`), False
    when the caller turned it off, None when it says nothing (the ``sam`` factory then makes
    one its drafters share). ``acceptance``: the caller's budget planner's acceptance model
    (:class:`~specdec.budget.acceptance.AcceptanceModel`), which composites order merged
    trees by when a node budget cuts them. ``recycling``: the matrices of Token Recycling the
    caller's model shares (:class:`~specdec.drafters.recycling_state.SharedMatrices`), None for a
    fresh matrix per drafter. ``model``: the target model object (a Hugging Face causal LM), for
    drafters that run its layers (``early-exit``); None where the caller has none to give.
    """

    vocab_size: int | None = None
    tokenizer: Any = None
    eos_token_ids: tuple[int, ...] = ()
    store: SharedStore | Literal[False] | None = None
    acceptance: AcceptanceModel | None = None
    recycling: SharedMatrices | None = None
    model: Any = None
    _identity: TokenizerIdentity | None = field(default=None, repr=False)

    def tokenizer_identity(self) -> TokenizerIdentity | None:
        if self._identity is None and self.tokenizer is not None:
            self._identity = TokenizerIdentity.of(self.tokenizer)
        return self._identity


@dataclass(frozen=True)
class Factory:
    """Makes fresh per-sequence drafters of one kind; shared indexes live in ``build``'s closure."""

    name: str
    build: Callable[[], Drafter]

    def create(self) -> Drafter:
        return self.build()


def parse_options(config_type: type[ConfigT], name: str, options: Mapping[str, Any]) -> ConfigT:
    """Build ``config_type(**options)``, naming the valid options when one is unknown."""
    valid = [f.name for f in dataclasses.fields(config_type)]  # type: ignore[arg-type]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise SpecDecError(f"drafter {name!r} has no option {unknown[0]!r}; valid options: {', '.join(valid)}")
    return config_type(**options)


def require_positive(name: str, **values: int) -> None:
    """Raise when any of ``values`` is not a positive int."""
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpecDecError(f"drafter {name!r}: {key} must be a positive int, got {value!r}")
