"""What the budget planner learned, saved across runs and processes ("planner statistics").

A :class:`~specdec.api.Generator` keeps its planner's :class:`~specdec.budget.acceptance.AcceptanceModel`
(acceptance per drafter source, feature, depth and rank) and
:class:`~specdec.budget.planner.Throughput` (the run's rate and per-step overhead) from one
prompt to the next; :func:`specdec.run` makes a new generator per call, so without this
module every one-off call would start from the prior and draft as if it knew nothing.
:class:`PlannerStatsFile` saves both after every generation and loads them when the next
generator of the same **identity** starts, in this process or any later one:

- the model: its architecture and dtype, device, attention, backend, KV cache kind, torch
  version and threads (the verifier's :meth:`~specdec.types.TunableVerifier.identity`, which the
  calibration keys on too, since the throughput depends on all of them), plus a fingerprint
  of its weights (:meth:`~specdec.types.TunableVerifier.weights_fingerprint`: two checkpoints of one
  architecture accept drafts differently);
- the tokenizer (a hash of its vocabulary: the acceptance of a token id depends on what it means);
- the drafter (its name and options, or a drafter object's class and name).

**File.** ``<cache_dir>/planner/<key>.json`` (``$SPECDEC_CACHE_DIR``, or
``$SPECDEC_PLANNER_DIR`` for this directory alone), ``key`` a hash of the identity. One
JSON object: ``format``, ``version``, ``checksum`` (SHA-256 of the canonical JSON of
``body``) and ``body`` (the identity, the counts, the throughput, how many runs saved it
and when). Written atomically (a temporary file renamed into place), so a reader sees a
whole file; when two processes save at once the last one wins (both hold recent counts).

**Bad files never break a run.** A file that does not parse, fails its checksum (a flipped
byte), has another format version (another specdec), another identity (copied from another
model or drafter) or values out of range gives one clear warning and a fresh start, and is
replaced at the next save. The statistics only steer how many draft nodes each step
verifies; verification keeps the output exact whatever they say, so even a file crafted to
pass every check can cost speed, never correctness.

**Off switch.** ``planner_cache=False`` (``run``, ``Generator``) or the environment variable
``SPECDEC_PLANNER_CACHE=0`` (also ``false``, ``off``, ``no``): nothing is loaded or saved.
Plain decoding (``drafter="none"``) decides no budget and keeps no file.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdec.budget.acceptance import AcceptanceModel
from specdec.budget.cost_model import VerifyCostModel
from specdec.budget.planner import Throughput
from specdec.cachefiles import PLANNER_DIR_ENV, TokenizerIdentity, checksum, folder, save_cache_entry
from specdec.errors import SpecDecError
from specdec.types import TunableVerifier

FORMAT = "specdec.planner-stats"
VERSION = 1  # bump when the body's meaning changes: older files then start afresh, with a warning
SWITCH_ENV = "SPECDEC_PLANNER_CACHE"
DIR_ENV = PLANNER_DIR_ENV
_OFF = frozenset({"0", "false", "off", "no"})

_TOKENIZERS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def enabled(option: bool | None = None) -> bool:
    """Whether planner statistics are loaded and saved: ``option`` when given, else ``$SPECDEC_PLANNER_CACHE``."""
    if option is not None:
        if not isinstance(option, bool):
            raise SpecDecError(f"planner_cache must be True, False or None, got {option!r}")
        return option
    return os.environ.get(SWITCH_ENV, "1").strip().lower() not in _OFF


def stats_dir() -> Path:
    """Where planner statistics live: ``$SPECDEC_PLANNER_DIR``, else ``<cache_dir>/planner``."""
    return folder("planner")


def _memo(table: weakref.WeakKeyDictionary[Any, str], owner: Any, compute: Any) -> str:
    """``compute()`` remembered per ``owner`` object while it lives (unless it refuses weak references)."""
    try:
        found = table.get(owner)
    except TypeError:
        return str(compute())
    if found is None:
        found = table[owner] = str(compute())
    return found


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """The tokenizer's vocabulary hash (:class:`~specdec.cachefiles.TokenizerIdentity`), or ``"none"``."""
    if tokenizer is None:
        return "none"
    return _memo(_TOKENIZERS, tokenizer, lambda: TokenizerIdentity.of(tokenizer).fingerprint)


def drafter_label(drafter: Any, options: Mapping[str, Any] | None = None) -> str:
    """The drafter's part of the identity: a name with its options, or an object's class and name.

    A ``datastore`` option counts by absolute path, so the same file named from two working
    directories is one identity; a model option (``draft_model``, also inside a composite part's
    options) by its class and weights' fingerprint, so one checkpoint is one identity in any process.
    """
    if isinstance(drafter, str):
        canonical = _canonical_options(options or {})
        return f"{drafter} {json.dumps(canonical, sort_keys=True, default=str)}"
    kind = type(drafter)
    return f"{kind.__module__}.{kind.__qualname__}:{getattr(drafter, 'name', '')}"


def _canonical_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with datastore paths made absolute and model objects named by their weights, nested dicts too."""
    canonical: dict[str, Any] = {}
    for key, value in options.items():
        if isinstance(value, Mapping):
            value = _canonical_options(value)
        elif key == "datastore" and isinstance(value, (str, os.PathLike)):
            value = str(Path(value).expanduser().resolve())
        elif callable(getattr(value, "named_parameters", None)):  # a torch module (a draft model)
            from specdec.backends.identity import weights_fingerprint

            value = f"{type(value).__name__} weights {weights_fingerprint(value)}"
        canonical[key] = value
    return canonical


def planner_identity(verifier: TunableVerifier[Any], tokenizer: Any, drafter: str) -> dict[str, str]:
    """What the saved statistics are valid for (module docstring), as strings."""
    identity = dict(verifier.identity())
    identity["weights"] = verifier.weights_fingerprint()
    identity["tokenizer"] = tokenizer_fingerprint(tokenizer)
    identity["drafter"] = drafter
    return identity


@dataclass
class PlannerStatsFile:
    """The saved statistics of one identity: :meth:`load` at a generator's start, :meth:`save` after each run.

    ``runs``: how many generations the saved statistics hold (loaded, then counted up by :meth:`save`).
    """

    path: Path
    identity: dict[str, str]
    runs: int = 0
    cost: Any = None  # the saved cost-model refinement (unchecked until applied: :meth:`load_cost`)

    @classmethod
    def for_identity(cls, identity: dict[str, str]) -> PlannerStatsFile:
        key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
        return cls(stats_dir() / f"{key}.json", identity)

    def read(self) -> dict[str, Any] | None:
        """The checked body of the file, None when there is none; raises :class:`SpecDecError` naming what is wrong."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (OSError, UnicodeDecodeError) as error:
            raise SpecDecError(f"cannot be read ({type(error).__name__}: {error})") from None
        try:
            document = json.loads(text)
        except json.JSONDecodeError as error:
            raise SpecDecError(f"is not JSON ({error.msg} at character {error.pos}): truncated or corrupt") from None
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise SpecDecError("is not a specdec planner-statistics file")
        if document.get("version") != VERSION:
            raise SpecDecError(
                f"was saved by another specdec (format version {document.get('version')!r}, this one reads {VERSION})"
            )
        body = document.get("body")
        if not isinstance(body, dict) or document.get("checksum") != checksum(body):
            raise SpecDecError("fails its checksum: corrupt")
        if body.get("identity") != self.identity:
            found = body.get("identity")
            theirs: dict[str, Any] = found if isinstance(found, dict) else {}
            differs = sorted(k for k in set(theirs) | set(self.identity) if theirs.get(k) != self.identity.get(k))
            raise SpecDecError(
                f"belongs to another model, tokenizer, drafter or device (differs in: {', '.join(differs)})"
            )
        return body

    def load(self, acceptance: AcceptanceModel, throughput: Throughput) -> int:
        """Load the saved statistics into ``acceptance`` and ``throughput``; :attr:`runs`, how many runs saved them.

        A bad file (module docstring) gives one warning and leaves both as they were: a fresh start.
        """
        try:
            body = self.read()
            if body is None:
                return 0
            runs = body.get("runs")
            if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
                raise SpecDecError(f"has a bad run count {runs!r}")
            rows = body.get("acceptance")
            if not isinstance(rows, list):
                raise SpecDecError("has no acceptance counts")
            measured = Throughput()
            try:
                measured.load_state(body.get("throughput"))  # checks every value before anything changes
                acceptance.load_state(rows)  # checks every row, then replaces the counts at once
            except SpecDecError as error:
                raise SpecDecError(f"has bad values ({error})") from None
        except SpecDecError as error:
            warnings.warn(
                f"specdec: ignoring the saved planner statistics {self.path}: it {error}; starting afresh",
                RuntimeWarning,
                stacklevel=3,
            )
            return 0
        throughput.load_state(measured.state())
        self.runs = runs
        self.cost = body.get("cost")
        return runs

    def load_cost(self, model: VerifyCostModel) -> bool:
        """Give ``model`` the saved online refinement of its table, if it has learned nothing yet.

        A model that has already seen steps (shared in this process) keeps what it measured;
        a saved state for another table (re-measured since) is skipped silently; a bad one
        warns once and changes nothing. True when the state was taken.
        """
        saved, self.cost = self.cost, None  # taken or refused, once
        if saved is None or model.observations > 0 or not model.learn:
            return False
        if isinstance(saved, dict) and saved.get("table") != model.table.digest():
            return False  # the table was measured again since: the saved refinement is moot
        try:
            model.load_state(saved)
        except SpecDecError as error:
            warnings.warn(f"specdec: ignoring the saved cost-model refinement in {self.path}: {error}",
                          RuntimeWarning, stacklevel=3)  # fmt: skip
            return False
        return True

    def save(self, acceptance: AcceptanceModel, throughput: Throughput, cost: VerifyCostModel | None = None) -> bool:
        """Count one more run and write the statistics (atomically); False, with a warning, when that fails.

        ``cost``: the cost model the run refined, saved with them when it learned anything."""
        self.runs += 1
        body: dict[str, Any] = {
            "identity": self.identity,
            "runs": self.runs,
            "saved_at": round(time.time(), 3),
            "acceptance": acceptance.state(),
            "throughput": throughput.state(),
        }
        if cost is not None and cost.learn and cost.observations > 0:
            body["cost"] = cost.state()
        document = {"format": FORMAT, "version": VERSION, "checksum": checksum(body), "body": body}
        # one warning per process and folder: a long-running server saves after every generation
        return save_cache_entry(self.path, json.dumps(document, indent=0), "the planner statistics")


def open_planner_stats(
    option: bool | None, verifier: TunableVerifier[Any], tokenizer: Any, drafter: Any, options: Mapping[str, Any] | None
) -> PlannerStatsFile | None:
    """The store of a generator's identity; None when planner statistics are off (:func:`enabled`) or moot
    (``drafter="none"``: plain decoding decides no budget)."""
    if not enabled(option) or drafter == "none":
        return None
    return PlannerStatsFile.for_identity(planner_identity(verifier, tokenizer, drafter_label(drafter, options)))


def summarize(path: Path) -> dict[str, Any]:
    """A saved file's description for ``specdec cache info``: drafter, device, runs, trials, age; or its problem."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        body = document["body"]
        identity = body["identity"]
        return {
            "file": path.name,
            "drafter": identity.get("drafter", "?"),
            "device": ", ".join(str(identity.get(k, "?")) for k in ("device", "dtype", "cache")),
            "runs": body.get("runs"),
            "trials": round(sum(row[-2] for row in body.get("acceptance", []) if len(row) == 3), 1),
            "saved_at": body.get("saved_at"),
            "ok": document.get("version") == VERSION and document.get("checksum") == checksum(body),
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as error:
        return {"file": path.name, "problem": f"{type(error).__name__}: {error}", "ok": False}
