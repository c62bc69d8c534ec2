"""The ground room: the cache directory, atomic writes, checksums and the tokenizer identity.

Everything specdec keeps between runs lies under :func:`cache_dir` (``$SPECDEC_CACHE_DIR``,
default ``~/.cache/specdec``), one folder per kind (:data:`KINDS`). One kind's folder can be
moved alone with ``$SPECDEC_<KIND>_DIR`` (``SPECDEC_MODELS_DIR``, ``SPECDEC_EXTENSIONS_DIR``,
``SPECDEC_CALIBRATION_DIR``, ``SPECDEC_PLANNER_DIR``, ...: :attr:`Kind.env`): the test suite
keeps the slow-to-rebuild kinds (converted models, compiled extensions) in the user's cache
and everything else in a fresh temporary one. Every file is rebuilt
on demand, so clearing any kind is safe; it only costs the time to rebuild it. ``clear``
removes only entries whose names specdec itself gives (hash-named files and folders), never
anything else that may sit in a relocated cache directory (``specdec cache info|clear``).

Every module that persists something imports this one: it writes through
:func:`atomic_file` (the one atomic writer: readers see the old file or the new one, never
half of one), seals JSON bodies with :func:`checksum`, and names the tokenizer a file was
made for with :class:`TokenizerIdentity`. This module imports nothing of specdec.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import operator
import os
import re
import shutil
import threading
import uuid
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

CACHE_DIR_ENV = "SPECDEC_CACHE_DIR"
PLANNER_DIR_ENV = "SPECDEC_PLANNER_DIR"  # the planner statistics' folder alone (Kind("planner").env)

_HASH16 = r"[0-9a-f]{16}"
_HASH_JSON = re.compile(rf"(\.)?{_HASH16}(\.json|-.*)$")  # a hash-named file, or its staging leftover


def cache_dir() -> Path:
    """The directory for converted models, compiled kernels, calibration data... (``$SPECDEC_CACHE_DIR``)."""
    root = os.environ.get(CACHE_DIR_ENV)
    if root:
        return Path(root).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specdec"


@dataclass(frozen=True)
class Kind:
    """One folder of the cache: its name, which entries specdec made there, and what they are."""

    name: str
    pattern: re.Pattern[str]
    about: str

    @property
    def env(self) -> str:
        """The variable that moves this kind's folder alone: ``SPECDEC_<NAME>_DIR`` (``SPECDEC_MODELS_DIR``)."""
        return f"SPECDEC_{self.name.upper()}_DIR"

    def folder(self) -> Path:
        """Where this kind's entries live: ``$SPECDEC_<NAME>_DIR`` when set, else ``<cache_dir>/<name>``."""
        moved = os.environ.get(self.env)
        if moved:
            return Path(moved).expanduser()
        return cache_dir() / self.name

    def entries(self) -> list[Path]:
        """specdec's own entries in this kind's folder, sorted by name."""
        folder = self.folder()
        if not folder.is_dir():
            return []
        return sorted(p for p in folder.iterdir() if self.pattern.fullmatch(p.name))


KINDS = (
    Kind("models", re.compile(_HASH16), "converted checkpoints of the default model (~20 s to convert again)"),
    Kind("extensions", re.compile(r"[\w.-]+-[0-9a-f]{12}"), "compiled kernels (about a minute to build again)"),
    Kind("calibration", _HASH_JSON, "verification cost per tree size, per model and device (~10 s on a CPU)"),
    Kind("planner", _HASH_JSON, "what budget='auto' learned per model, tokenizer, drafter and device"),
    Kind("recycling", re.compile(rf"(\.)?{_HASH16}(\.npz|-.*)$"), "Token Recycling's matrix per model (what its "
         "drafts start from)"),
    Kind("compiled", re.compile(_HASH16), "engine='compiled' forwards compiled by inductor, per torch version and CPU "
         "(a later process skips most of the compile: specdec compile fills it)"),
    Kind("tokenizers", _HASH_JSON, "vocabulary hashes of tokenizers loaded from local folders (their identity "
         "in planner statistics and datastores; ~50 ms to compute again)"),
    Kind("trusted", _HASH_JSON, "stamps of fully verified large datastores (they load without a full read)"),
    Kind("datastores", re.compile(r"\w+-bench\.\w+"), "datastores built by the benchmarks"),
    Kind("vllm_check", re.compile(_HASH16), "corpora of the vLLM integration check"),
)


def kind(name: str) -> Kind:
    """The kind of cache entry called ``name`` (:data:`KINDS`)."""
    for candidate in KINDS:
        if candidate.name == name:
            return candidate
    raise ValueError(f"unknown cache kind {name!r}; kinds: {', '.join(k.name for k in KINDS)}")


def folder(name: str) -> Path:
    """The folder of the cache kind ``name``: ``folder("calibration")`` is ``<cache_dir>/calibration``."""
    return kind(name).folder()


@contextmanager
def atomic_file(path: str | os.PathLike[str], binary: bool = False) -> Iterator[IO[Any]]:
    """A new file to write, renamed over ``path`` when the block ends; removed if the block raises.

    The file is made beside ``path`` (``.<stem>-<random>``, so an interrupted write leaves a
    hidden leftover that ``specdec cache clear`` recognises) with the usual permissions, and
    renamed into place in one step: a reader sees the old whole file or the new whole file.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{target.stem}-{uuid.uuid4().hex[:12]}")
    try:
        with open(staging, "xb" if binary else "x", encoding=None if binary else "utf-8") as out:
            yield out
        os.replace(staging, target)
    except BaseException:
        with contextlib.suppress(OSError):  # a read-only folder refuses even this: the first error is the one
            staging.unlink(missing_ok=True)
        raise


def write_atomically(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` through :func:`atomic_file`: readers see a whole file."""
    with atomic_file(path) as out:
        out.write(text)


_WARNED: set[tuple[str, ...]] = set()  # the keys of the cache problems warned about in this process
_WARNED_LOCK = threading.Lock()


def warn_once(key: tuple[str, ...], message: str, stacklevel: int = 3) -> None:
    """``message`` as a RuntimeWarning the first time ``key`` comes up in this process, then never again.

    A cache problem (a file that cannot be written, or read) recurs at every generation of a
    long-running process: it is said once, and the caller goes on without the entry.
    """
    with _WARNED_LOCK:
        if key in _WARNED:
            return
        _WARNED.add(key)
    warnings.warn(message, RuntimeWarning, stacklevel=stacklevel + 1)


def forget_warnings(topic: str) -> None:
    """Let the warnings of ``topic`` (a key's first part: ``"calibration"``, ``"unwritable"``) be said again."""
    with _WARNED_LOCK:
        _WARNED.difference_update({key for key in _WARNED if key[0] == topic})


def warn_unwritable_once(what: str, path: str | os.PathLike[str], error: OSError) -> None:
    """One warning per ``what``, folder and process that the cache entry at ``path`` could not be written.

    A cache that cannot take an entry (read-only, full, no permission) must cost only that entry:
    the caller goes on with what it computed, and a long-running process saving after every
    generation warns once, not once a generation.
    """
    warn_once(("unwritable", what, str(Path(path).parent)),
              f"specdec: could not save {what} to {path} ({error.strerror or error}); going on without "
              f"saving it (the cache folder is read-only, full or not ours: point {CACHE_DIR_ENV} elsewhere)")


def save_cache_entry(path: str | os.PathLike[str], data: bytes | str, what: str) -> bool:
    """Write a cache entry atomically (:func:`atomic_file`); False, with :func:`warn_unwritable_once`, on OSError.

    For every file specdec writes for itself (a cache entry is rebuilt on demand), never for a
    file a user asked for: a failure to write one must not throw away the result it came with.
    """
    try:
        with atomic_file(path, binary=isinstance(data, bytes)) as out:
            out.write(data)
    except OSError as error:
        warn_unwritable_once(what, path, error)
        return False
    return True


def checksum(document: Any) -> str:
    """SHA-256 of ``document``'s canonical JSON (sorted keys, no spaces): what a saved file's body must hash to."""
    return hashlib.sha256(json.dumps(document, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class TokenizerIdentity:
    """Who can use a file made for a tokenizer (a datastore, planner statistics): a hash of its vocabulary and its size.

    ``fingerprint`` hashes the sorted (token string, id) pairs, so two tokenizers agree
    only when every id means the same string. ``name`` is informative (error messages).
    """

    fingerprint: str
    vocab_size: int
    name: str = ""

    @classmethod
    def of(cls, tokenizer: Any) -> TokenizerIdentity:
        """The identity of ``tokenizer``: hashed from its vocabulary, or read back from the ``tokenizers``
        cache when a tokenizer loaded from the same local files (:func:`_tokenizer_files_key`) was hashed
        before (the hash costs ~50 ms on a 49k vocabulary, a noticeable share of a one-off ``run``)."""
        name = str(getattr(tokenizer, "name_or_path", ""))
        key = _tokenizer_files_key(tokenizer)
        if key is not None:
            known = _known_tokenizer(key)
            if known is not None:
                return cls(known[0], known[1], name)
        identity = cls.hashed(tokenizer)
        if key is not None:
            with contextlib.suppress(OSError):  # a read-only cache: the next process hashes again
                write_atomically(folder("tokenizers") / f"{key}.json",
                                 json.dumps({"fingerprint": identity.fingerprint, "vocab_size": identity.vocab_size}))
        return identity

    @classmethod
    def hashed(cls, tokenizer: Any) -> TokenizerIdentity:
        """The identity computed from ``tokenizer``'s vocabulary (what :meth:`of` caches)."""
        vocab = tokenizer.get_vocab()
        # Sorted by token string alone: the strings are unique, so this is the (string, id) pairs' order
        # (the digest every saved file carries), without comparing tuples (~7 ms less on a 49k vocabulary).
        pairs = sorted(vocab.items(), key=operator.itemgetter(0))
        digest = hashlib.sha256(json.dumps(pairs, ensure_ascii=False).encode())
        size = max(len(tokenizer), max(vocab.values(), default=-1) + 1)
        return cls(digest.hexdigest()[:24], int(size), str(getattr(tokenizer, "name_or_path", "")))


# The files a tokenizer folder's vocabulary can come from (transformers' names for every tokenizer kind).
_TOKENIZER_FILES = ("tokenizer", "vocab", "merges", "added_tokens", "special_tokens_map", "spiece", "sentencepiece")


def _tokenizer_files_key(tokenizer: Any) -> str | None:
    """A key for ``tokenizer``'s identity that costs no pass over its vocabulary, or None when there is none.

    Only for a tokenizer loaded from a local folder (``name_or_path``): the key hashes its class, the
    folder, each tokenizer file's name and bytes, its length and its added tokens, so editing a file, or
    adding tokens to the loaded object, gives another key (and a fresh hash). The files' bytes, not their
    size and modification time: a rewrite of the same size within one timestamp tick keeps both, and
    tokenizer files are small (a few MB: hashing them is a small part of hashing the vocabulary). What
    it cannot see is a vocabulary changed in memory without a new token (editing the backend's model
    by hand): such a tokenizer keeps its folder's identity.
    """
    try:
        folder_path = Path(str(getattr(tokenizer, "name_or_path", "") or ""))
        if not str(folder_path) or not folder_path.is_dir():
            return None
        files = sorted(p for p in folder_path.iterdir() if p.name.startswith(_TOKENIZER_FILES) and p.is_file())
        if not files:
            return None
        stamps = [(p.name, hashlib.sha256(p.read_bytes()).hexdigest()) for p in files]
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        added_tokens = sorted((int(i), str(getattr(t, "content", t))) for i, t in added.items())
        document = [type(tokenizer).__qualname__, str(folder_path.resolve()), stamps, len(tokenizer), added_tokens]
    except (OSError, TypeError, ValueError):
        return None
    return hashlib.sha256(json.dumps(document, ensure_ascii=False).encode()).hexdigest()[:16]


def _known_tokenizer(key: str) -> tuple[str, int] | None:
    """The (fingerprint, vocabulary size) cached under ``key``; None when absent, unreadable or malformed."""
    try:
        record = json.loads((folder("tokenizers") / f"{key}.json").read_text())
        fingerprint, size = record["fingerprint"], record["vocab_size"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(fingerprint, str) or not re.fullmatch(r"[0-9a-f]{24}", fingerprint):
        return None
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        return None
    return fingerprint, size


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def info() -> dict[str, Any]:
    """The cache's contents: per kind its folder, entry count, bytes and meaning."""
    kinds = []
    for each in KINDS:
        entries = each.entries()
        kinds.append({"kind": each.name, "folder": str(each.folder()), "entries": len(entries),
                      "bytes": sum(_size(p) for p in entries), "about": each.about})
    return {"cache_dir": str(cache_dir()), "kinds": kinds}


def clear(names: Sequence[str]) -> list[dict[str, Any]]:
    """Remove specdec's entries of the kinds ``names`` (all kinds when empty); what was removed, per kind."""
    removed = []
    for each in KINDS:
        if names and each.name not in names:
            continue
        entries = each.entries()
        freed = 0
        for entry in entries:
            freed += _size(entry)
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        removed.append({"kind": each.name, "entries": len(entries), "bytes": freed})
    return removed
