"""Token Recycling's matrix, shared by a model's generations and kept across processes.

Why: the matrix (:mod:`specdec.drafters.recycling`) is what Token Recycling drafts from, and
it starts empty. A drafter named by a string used to start every request with an empty one,
so each ``specdec.run`` call drafted cold for its first tens of steps, and one call per fresh
process measured 1.35x plain decoding against 1.59x for a warmed ``Generator`` (issue 30).
Here a :class:`RecyclingMatrix` belongs to the **model** (its weights' fingerprint), its
vocabulary size and ``k``: every generator of that model in a process shares one
(:func:`shared_matrix`), so what one generation learned the next drafts with, and with the
learned-state cache on (``planner_cache``, the switch the budget planner's statistics use:
:mod:`specdec.budget.planner_stats`) it is saved after each generation and loaded by the
first generator of a later process.

**What it holds.** For each token id, the ``k`` tokens the model most recently ranked most
likely after it, in some recent context: the model's predictions, no text and no order of
texts. Generated text itself is shared between calls only when the caller asks (``store=``).
Sharing is lossless: the matrix only proposes drafts; verification decides every token.
Generations in threads (or rows of a batch) write rows of one matrix: their drafts may
change, their outputs cannot.

**File.** ``<cache_dir>/recycling/<key>.npz`` (``key`` a hash of the identity): arrays
``matrix`` (int32 ``[V, k]``, ``-1`` = never written) and ``meta`` (JSON: format, version,
identity). Written atomically. A file that does not load, or has another format version,
identity or shape, gives one warning and a fresh start, and is replaced at the next save.
"""

from __future__ import annotations

import hashlib
import io
import json
import threading
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from specdec.cachefiles import folder, save_cache_entry

FORMAT = "specdec.recycling-matrix"
VERSION = 1
UNKNOWN = -1  # a matrix entry never written

MatrixArray = npt.NDArray[np.int32]


class RecyclingMatrix:
    """The matrix ``M`` (``[V, k]``) plus one sentinel row of ``-1`` (what an unknown token reads).

    ``array`` is replaced when the vocabulary turns out larger than known (amortized
    doubling), so drafters read it through this holder, never keep the array itself.
    ``changed``: rows were written since the last save.
    """

    def __init__(self, k: int, vocab_size: int | None = None) -> None:
        self.k = k
        self.array: MatrixArray = np.full(((vocab_size or 0) + 1, k), UNKNOWN, dtype=np.int32)
        self.changed = False

    @property
    def rows(self) -> int:
        """Token ids the matrix has rows for (the sentinel excluded)."""
        return int(self.array.shape[0]) - 1

    def grow(self, max_token: int) -> None:
        """Make room for rows up to ``max_token``."""
        rows = self.rows
        if max_token < rows:
            return
        grown = np.full((max(max_token + 1, 2 * rows) + 1, self.k), UNKNOWN, dtype=np.int32)
        grown[:rows] = self.array[:rows]
        self.array = grown

    def clear(self) -> None:
        self.array[:] = UNKNOWN
        self.changed = True


_SHARED: dict[tuple[str, int, int], RecyclingMatrix] = {}
_LOCK = threading.Lock()


def matrix_path(identity: dict[str, str]) -> Path:
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return folder("recycling") / f"{key}.npz"


def _identity(weights: str, vocab_size: int, k: int) -> dict[str, str]:
    return {"weights": weights, "vocab_size": str(vocab_size), "k": str(k)}


def load(path: Path, identity: dict[str, str], k: int, vocab_size: int) -> MatrixArray | None:
    """The saved matrix ``[V, k]`` at ``path`` if it is whole and this identity's; else None (with a warning
    for a file that is there but unusable)."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(bytes(data["meta"]).decode())
            matrix = np.asarray(data["matrix"])
        problem = None
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            problem = f"format {meta.get('format')!r} version {meta.get('version')!r}, expected {FORMAT!r} {VERSION}"
        elif meta.get("identity") != identity:
            problem = "it was saved for another model, vocabulary or k"
        elif matrix.dtype != np.int32 or matrix.shape != (vocab_size, k):
            problem = f"a {matrix.dtype} matrix of shape {matrix.shape}, expected int32 ({vocab_size}, {k})"
        elif matrix.size and (matrix.min() < UNKNOWN or matrix.max() >= vocab_size):
            problem = "token ids outside the vocabulary"
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, UnicodeDecodeError) as error:
        problem = f"it does not load ({type(error).__name__}: {error})"
    if problem is not None:
        warnings.warn(f"specdec: ignoring the saved Token Recycling matrix {path} ({problem}); starting afresh",
                      RuntimeWarning, stacklevel=4)  # fmt: skip
        return None
    return matrix


def save(state: RecyclingMatrix, path: Path, identity: dict[str, str], vocab_size: int) -> None:
    """Write ``state``'s first ``vocab_size`` rows to ``path`` atomically (only when rows changed).

    A cache that refuses the file (read-only, full) gives one warning per process and leaves the
    rows marked changed, so a later save tries again; the caller's generation is unaffected."""
    if not state.changed:
        return
    matrix = np.full((vocab_size, state.k), UNKNOWN, dtype=np.int32)
    rows = min(vocab_size, state.rows)
    matrix[:rows] = state.array[:rows]
    meta = json.dumps({"format": FORMAT, "version": VERSION, "identity": identity}).encode()
    buffer = io.BytesIO()
    np.savez(buffer, matrix=matrix, meta=np.frombuffer(meta, dtype=np.uint8))
    # A read-only or full cache costs the saved matrix (one warning), never the generation's result.
    if save_cache_entry(path, buffer.getvalue(), "Token Recycling's matrix"):
        state.changed = False


class SharedMatrices:
    """A generator's door to the shared matrices of its model (what :class:`~specdec.drafters.DrafterContext`
    hands the ``recycling`` factory): :meth:`get` one per ``k``, :meth:`save` after a generation.

    ``weights``: the model's weights fingerprint; ``persist``: load from and save to the cache.
    """

    def __init__(self, weights: str, vocab_size: int, persist: bool) -> None:
        self.weights = weights
        self.vocab_size = vocab_size
        self.persist = persist
        self._used: dict[int, RecyclingMatrix] = {}

    def get(self, k: int) -> RecyclingMatrix:
        """The matrix every generator of this model shares for top-``k`` recycling (loaded on first use)."""
        key = (self.weights, self.vocab_size, k)
        with _LOCK:
            state = _SHARED.get(key)
            if state is None:
                state = _SHARED[key] = RecyclingMatrix(k, self.vocab_size)
                if self.persist:
                    identity = _identity(self.weights, self.vocab_size, k)
                    saved = load(matrix_path(identity), identity, k, self.vocab_size)
                    if saved is not None:
                        state.array[: self.vocab_size] = saved
        self._used[k] = state
        return state

    def save(self) -> None:
        """Save every matrix this generator's drafters used, where rows changed (``persist`` only)."""
        if not self.persist:
            return
        for k, state in self._used.items():
            identity = _identity(self.weights, self.vocab_size, k)
            save(state, matrix_path(identity), identity, self.vocab_size)


def snapshot_shared() -> dict[tuple[str, int, int], MatrixArray]:
    """A copy of every shared matrix of the process (benchmarks: each timed run starts from the same one)."""
    with _LOCK:
        return {key: state.array.copy() for key, state in _SHARED.items()}


def restore_shared(snapshot: dict[tuple[str, int, int], MatrixArray]) -> None:
    """Put :func:`snapshot_shared`'s copies back (matrices made since are left as they are)."""
    with _LOCK:
        for key, array in snapshot.items():
            state = _SHARED.get(key)
            if state is not None:
                state.array = array.copy()
                state.changed = True


def clear_shared() -> None:
    """Empty every shared matrix of the process (benchmarks: start from a matrix that has seen no prompt)."""
    with _LOCK:
        for state in _SHARED.values():
            state.clear()


def forget_shared() -> None:
    """Drop the process's shared matrices (tests; a changed cache directory)."""
    with _LOCK:
        _SHARED.clear()


def describe(path: Path) -> dict[str, Any]:
    """A saved matrix's identity and how many rows it knows (``specdec cache info``)."""
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(bytes(data["meta"]).decode())
        matrix = np.asarray(data["matrix"])
    return {"identity": meta.get("identity"), "rows_known": int((matrix[:, 0] != UNKNOWN).sum())}
