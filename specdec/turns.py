"""A :class:`~specdec.Generator`'s calls taking turns: one generation at a time.

Its one verifier, static cache and planner statistics serve one sequence at a time, so its calls
(``generate``, ``warm_up``, ``cost_model``, a batch from its first row to its last) each hold a lock,
whole; calls from other threads wait. A call from the thread that holds the lock (a ``generate``
from inside its own ``on_tokens`` callback) would wait for itself: it is refused with a
:class:`~specdec.errors.SpecDecError` instead. After :meth:`Turns.closing` every turn is refused.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

from specdec.errors import SpecDecError

T = TypeVar("T")


class Turns:
    """The lock a Generator's calls take turns on, the thread that holds it, and whether it was closed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holder: int | None = None  # the thread that holds the lock
        self.closed = False

    @contextmanager
    def turn(self, what: str) -> Iterator[None]:
        """Hold the lock for ``Generator.what``; a re-entrant call or a closed generator is an error."""
        me = threading.get_ident()
        if self._holder == me:
            raise SpecDecError(
                f"Generator.{what} was called while this thread is inside one of the generator's own calls "
                "(e.g. from an on_tokens callback): a Generator runs one generation at a time"
            )
        with self._lock:
            if self.closed:
                raise SpecDecError(f"Generator.{what}: this Generator was closed; make a new one")
            self._holder = me
            try:
                yield
            finally:
                self._holder = None

    def held(self, what: str, items: Iterator[T]) -> Iterator[T]:
        """``items`` under one turn, from the first item to the last (or until the iterator is closed)."""
        with self.turn(what):
            yield from items

    @contextmanager
    def closing(self) -> Iterator[None]:
        """The last turn (``Generator.close``): it waits for the running call, and every later turn is refused."""
        if self._holder == threading.get_ident():
            raise SpecDecError("Generator.close was called from inside one of the generator's own calls")
        with self._lock:
            self.closed = True
            yield
