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


def warn_deprecated(message: str) -> None:
    """A :class:`DeprecationWarning` with ``message``, attributed to the first caller outside specdec
    (so Python's default filters show it to the user whose code uses the old spelling)."""
    import sys
    import warnings

    frame = sys._getframe(1)
    level = 2
    while frame.f_back is not None and str(frame.f_globals.get("__name__", "")).startswith("specdec."):
        frame = frame.f_back
        level += 1
    warnings.warn(message, DeprecationWarning, stacklevel=level)
