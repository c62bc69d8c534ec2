"""Errors specdec raises for bad input. Every message names the bad value."""

from __future__ import annotations


class SpecDecError(ValueError):
    """Bad input or an unsupported combination, caught at the boundary."""


class InvalidDraftTreeError(SpecDecError):
    """A draft tree whose tokens/parents arrays break the DraftTree invariants."""


class UnsupportedModelError(SpecDecError):
    """A model or attention implementation that tree verification cannot serve exactly."""


class DatastoreError(SpecDecError):
    """A datastore file that is corrupt, truncated, of an unknown version or built for another tokenizer."""
