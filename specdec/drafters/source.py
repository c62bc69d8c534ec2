"""Where a :class:`~specdec.Generator`'s drafters come from: the context they are made in, and the user's drafter.

:func:`drafter_context` is what every factory of a generator is told of its target and handed of
what the generator shares (:class:`~specdec.drafters.base.DrafterContext`); :class:`DrafterSource`
turns the user's ``drafter`` argument (a registered name, a factory, or a
:class:`~specdec.types.Drafter` object) into a drafter per sequence.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

from specdec.budget.acceptance import AcceptanceModel
from specdec.datastores.shared_store import SharedStore
from specdec.drafters import make_factory, resolve_drafter
from specdec.drafters.base import DrafterContext
from specdec.drafters.recycling_state import SharedMatrices
from specdec.errors import SpecDecError
from specdec.models import eos_token_ids
from specdec.types import Drafter, DrafterFactory


def drafter_context(
    model: Any, tokenizer: Any, vocab_size: int, weights: str, *, store: SharedStore | Literal[False] | None,
    acceptance: AcceptanceModel, learned: bool,
) -> DrafterContext:
    """The context of a generator's drafters: the target ``model`` (its ``vocab_size``, end ids and
    ``tokenizer``), the generator's ``store`` and its planner's ``acceptance`` model.

    What drafters learned from this model (Token Recycling's matrix, keyed on the model's
    ``weights`` fingerprint) is shared by its generators in this process and kept across processes,
    under the switch of the planner's statistics: ``learned`` (False: a fresh matrix per drafter).
    """
    recycling = SharedMatrices(weights, vocab_size, learned)
    return DrafterContext(
        vocab_size=vocab_size,
        tokenizer=tokenizer,
        eos_token_ids=eos_token_ids(model, tokenizer),
        store=store,
        acceptance=acceptance,
        recycling=recycling if learned else None,
        model=model,
    )


class DrafterSource:
    """A drafter per sequence from the user's ``spec``: a registered name (a fresh drafter from its
    factory), a factory, or a :class:`~specdec.types.Drafter` object (reused as is, with its state).

    A named drafter's factory is made once (it may load a datastore) and checked here, so a bad
    name or option fails at construction, before any generation. ``options``: the named drafter's,
    with ``datastore`` (a path) as shorthand for the datastore option of retrieval drafters.
    """

    def __init__(
        self, spec: str | Drafter | DrafterFactory, options: Mapping[str, Any] | None,
        datastore: str | os.PathLike[str] | None, context: DrafterContext,
    ) -> None:
        self.spec = spec
        self.options = dict(options or {})
        if datastore is not None:
            self.options["datastore"] = os.fspath(datastore)
        self.factory: DrafterFactory | None = None
        if isinstance(spec, str):
            self.factory = make_factory(spec, self.options, context)
        elif self.options:
            raise SpecDecError("drafter options apply only when the drafter is given by name")

    def create(self) -> Drafter:
        """The drafter for the next sequence: fresh from the factory, or the user's object as is."""
        if self.factory is not None:
            return self.factory.create()
        return resolve_drafter(self.spec)

    def check_rows(self, places: int) -> None:
        """Refuse a batch of ``places`` rows (each needs its own drafter) where ``spec`` is one Drafter object."""
        if places > 1 and self.factory is None and isinstance(self.spec, Drafter):
            raise SpecDecError(
                "a batch gives every row its own drafter: pass the drafter by name or as a factory (a Drafter "
                "object serves one sequence at a time), or batch_size=1"
            )


def finish(drafter: Drafter) -> None:
    """The drafter's sequence ended: its ``finish``, where it has one (e.g. ``sam`` adds it to its store)."""
    done = getattr(drafter, "finish", None)
    if callable(done):
        done()
