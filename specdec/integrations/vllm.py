"""specdec's retrieval drafters inside vLLM, as a proposer for its ``custom_class`` method.

Usage (vLLM 0.32; the GPU and the CPU builds alike; ``docs/serving.md`` has more)::

    from vllm import LLM, SamplingParams
    from specdec.integrations.vllm import engine_args

    llm = LLM(model=PATH, **engine_args("sam", num_speculative_tokens=8, tokenizer=PATH))

``engine_args`` returns two engine arguments. ``speculative_config`` names the
:class:`Proposer` class (``{"method": "custom_class", "model": PROPOSER,
"num_speculative_tokens": k}``); ``additional_config`` carries which specdec drafter to
run (``{"specdec": {"drafter": "sam", "options": {...}}}``). The drafter travels in
``additional_config`` because vLLM's ``SpeculativeConfig`` refuses fields it does not
know (pydantic, ``extra="forbid"``), while ``VllmConfig.additional_config`` is vLLM's own
free-form dict that reaches every worker. With no ``"specdec"`` entry the proposer runs
``sam`` with its defaults.

**The interface** (``vllm/v1/spec_decode/custom_class_proposer.py`` and the call in
``vllm/v1/worker/gpu_model_runner.py``): each worker imports the class, calls
``Proposer(vllm_config)`` once, and after every engine step calls
``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None)``
for the whole batch, which returns one chain of draft token ids per batch row:

- ``sampled_token_ids``: ``num_rows`` lists, the tokens this step added to each row
  (its accepted draft tokens and the bonus); an empty list means the row produced nothing
  this step (a prefill chunk, a discarded sample), and it gets no draft;
- ``num_tokens_no_spec``: int ``[max_num_reqs]``, each row's context length (prompt and
  output, this step's tokens included);
- ``token_ids_cpu``: int32 ``[max_num_reqs, max_model_len]``, each row's context in its
  first ``num_tokens_no_spec[row]`` entries.

In specdec's words, a row's context ``c = token_ids_cpu[row, :n]`` is its committed tokens
``c[:n-1]`` plus the pending token ``c[n-1]`` (chosen by the model, not yet run through
it): exactly what a :class:`~specdec.types.Drafter` takes (``update`` with the new
committed tokens, then ``propose(pending, ...)``).

**Per-request state, keyed by row.** vLLM passes no request ids, and a request changes
rows when the batch is condensed (a request finished) or when it is preempted and comes
back. Each row's state (one drafter from the factory: a dynamic automaton, cursors)
remembers its committed length ``L``, its pending token, and its first and last
:data:`CHECK_TOKENS` committed tokens. The row **extends** its state when ``n - 1 > L``,
``c[L]`` is the old pending token (now committed) and both ends match: O(CHECK_TOKENS)
per row, never O(context). Then only the new tokens ``c[L:n-1]`` reach the drafter. A
row that does not extend its state takes a state detached in this or the previous call
that it extends (a request that moved rows), else a fresh one built from its context
(O(n), once per request). Detached states not claimed within one call are freed. A state
given to the wrong request (two requests agreeing on every checked token) can only cost
acceptance, never exactness: vLLM verifies every draft token against the model.

Shared read-only indexes (a static automaton, a REST datastore) live in the drafter
factory, loaded once per worker and checked against the engine's tokenizer when the
proposer is built, so a bad datastore fails at engine start.

**Trees become chains.** vLLM 0.32 verifies chains only. Where the drafter makes a tree,
the proposer sends the root-to-node path with the most expected accepted tokens,
``sum(p_i)`` along the path, where ``p_i`` is the acceptance model's probability that
node ``i`` is accepted (:mod:`specdec.budget.acceptance`, the budget planner's model;
ties go to the lower node index, i.e. the drafter's own order). Only nodes with
``p_i >= min_accept`` count, so a chain is also cut where its tokens become unlikely. The
model learns online from what vLLM accepted: the next call's tokens show how many of each
row's draft tokens were accepted. One cut draft in :data:`PROBE_EVERY` is sent with twice
the tokens (at least one), as the budget planner probes, so a source whose first drafts
failed is tried again. At most ``num_speculative_tokens`` tokens, and none past
``max_model_len``.

What is lost against specdec's own engine: trees (one chain per step), drafters that
learn from the model's top-k predictions (Token Recycling: vLLM passes the proposer no
logits, so ``recycling`` and its composites are refused), and the cost-aware draft
budget (vLLM fixes the draft length).

Cost per row and step: O(CHECK_TOKENS + new tokens) to check and advance the state, the
drafter's own step (~10 us for ``sam``), O(k) to observe the last chain's acceptance.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy.typing as npt
from transformers import AutoTokenizer

from specdec.budget.acceptance import AcceptanceModel, NodeKey, node_keys
from specdec.cachefiles import write_atomically
from specdec.drafters import DrafterContext, make_factory
from specdec.errors import SpecDecError
from specdec.types import Drafter, DrafterFactory, DraftTree

# What vLLM imports (speculative_config["model"]) and where it finds the drafter.
PROPOSER = "specdec.integrations.vllm.Proposer"
CONFIG_KEY = "specdec"
DEFAULT_DRAFTER = "sam"
DEFAULT_NUM_SPECULATIVE_TOKENS = 8
# Committed tokens a row state remembers at each end of its context, to tell its request
# from another one in the same row.
CHECK_TOKENS = 8
_SPEC_KEYS = ("drafter", "options", "min_accept", "stats_path")
# A draft node is sent only if the acceptance model gives it at least this probability of
# being accepted (measured on the CPU build: docs/serving.md). The model starts every
# conditional acceptance at its prior.
ACCEPTANCE_PRIOR = 0.5
DEFAULT_MIN_ACCEPT = 0.5
# One draft in this many that min_accept cut is sent with twice the tokens (at least one):
# without trials past the cut, a source whose first drafts failed would never be tried again
# (the acceptance model only learns from what is verified). As the budget planner's probes.
PROBE_EVERY = 16

TokenRow = npt.NDArray[Any]  # int ``[max_model_len]``: one row of vLLM's token_ids_cpu


# -- which drafter ------------------------------------------------------------------------


def _normalise_options(options: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A JSON-ready copy of ``options``: datastore paths made absolute (the engine's workers
    may run elsewhere in the file system than the caller), nested part options kept."""
    normalised: dict[str, Any] = {}
    for key, value in options.items():
        if not isinstance(key, str):
            raise SpecDecError(f"{where}: option names must be strings, got {key!r}")
        if isinstance(value, Mapping):
            value = _normalise_options(value, f"{where}, option {key!r}")
        elif (key == "datastore" or key.endswith(".datastore")) and isinstance(value, (str, os.PathLike)):
            value = str(Path(value).expanduser().absolute())
        normalised[key] = value
    try:
        json.dumps(normalised)
    except (TypeError, ValueError) as error:
        raise SpecDecError(f"{where}: options must be JSON values (they travel in vLLM's additional_config): "
                           f"{error}") from error
    return normalised


def _names_datastore(options: Mapping[str, Any]) -> bool:
    return any(key == "datastore" or key.endswith(".datastore") or
               (isinstance(value, Mapping) and _names_datastore(value)) for key, value in options.items())


@dataclass(frozen=True)
class DrafterSpec:
    """Which specdec drafter a :class:`Proposer` runs, as it travels in ``additional_config["specdec"]``.

    ``drafter``: a registered name or composite (``"sam"``, ``"pld"``, ``"rest"``,
    ``"sam+pld"``); ``options``: the drafter's options, as :func:`specdec.drafters.make_factory`
    takes them; ``min_accept``: the least probability of acceptance (the acceptance model's
    ``p``) of a draft token worth sending, in ``[0, 1)``: 0 sends every node of the chosen
    path, higher values send shorter, surer chains (a verified token costs more on a CPU
    than on a GPU); ``stats_path``: a file the proposer rewrites every
    :data:`Proposer.STATS_EVERY` calls with its counters (:meth:`Proposer.summary`), or None.

    >>> DrafterSpec.from_json({"drafter": "pld", "options": {"num_draft": 4}}).to_json()
    {'drafter': 'pld', 'options': {'num_draft': 4}}
    """

    drafter: str = DEFAULT_DRAFTER
    options: Mapping[str, Any] = field(default_factory=dict)
    min_accept: float = DEFAULT_MIN_ACCEPT
    stats_path: str | None = None

    @classmethod
    def from_json(cls, value: Any) -> DrafterSpec:
        """Read (and check) ``additional_config["specdec"]``; None gives the defaults."""
        if value is None:
            return cls()
        where = f"additional_config[{CONFIG_KEY!r}]"
        if not isinstance(value, Mapping):
            raise SpecDecError(f"{where} must be a dict with keys {', '.join(_SPEC_KEYS)}, got {value!r}")
        unknown = sorted(set(value) - set(_SPEC_KEYS))
        if unknown:
            raise SpecDecError(f"{where} has no key {unknown[0]!r}; valid keys: {', '.join(_SPEC_KEYS)}")
        drafter = value.get("drafter", DEFAULT_DRAFTER)
        if not isinstance(drafter, str) or not drafter.strip():
            raise SpecDecError(f"{where}['drafter'] must be a drafter name such as 'sam', got {drafter!r}")
        options = value.get("options") or {}
        if not isinstance(options, Mapping):
            raise SpecDecError(f"{where}['options'] must be a dict of drafter options, got {options!r}")
        min_accept = value.get("min_accept", DEFAULT_MIN_ACCEPT)
        if isinstance(min_accept, bool) or not isinstance(min_accept, (int, float)) or not 0 <= min_accept < 1:
            raise SpecDecError(f"{where}['min_accept'] must be a probability in [0, 1), got {min_accept!r}")
        stats_path = value.get("stats_path")
        if stats_path is not None and not isinstance(stats_path, (str, os.PathLike)):
            raise SpecDecError(f"{where}['stats_path'] must be a file path, got {stats_path!r}")
        return cls(drafter.strip().lower(), _normalise_options(options, f"drafter {drafter!r}"), float(min_accept),
                   None if stats_path is None else str(Path(stats_path).expanduser().absolute()))

    def to_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {"drafter": self.drafter, "options": dict(self.options)}
        if self.min_accept != DEFAULT_MIN_ACCEPT:
            found["min_accept"] = self.min_accept
        if self.stats_path is not None:
            found["stats_path"] = self.stats_path
        return found

    @property
    def needs_tokenizer(self) -> bool:
        """Whether an option names a datastore, which must be checked against the engine's tokenizer."""
        return _names_datastore(self.options)


def build_factory(spec: DrafterSpec, context: DrafterContext) -> DrafterFactory:
    """The drafter factory of ``spec``, refusing drafters that need what vLLM does not pass.

    Loads shared datastores (checked against ``context``'s tokenizer or vocabulary) and
    builds compiled extensions now, so every bad input fails here: an unknown name or
    option, a missing or foreign datastore, a drafter that learns from the model.
    """
    factory = make_factory(spec.drafter, spec.options, context)
    probe = factory.create()
    if probe.feedback_topk > 0:
        raise SpecDecError(
            f"drafter {spec.drafter!r} learns from the model's top-k predictions (Token Recycling), which vLLM "
            "does not pass to a custom_class proposer; use a retrieval drafter or a composite of them "
            "('sam', 'pld', 'rest', 'sam+pld', ...)"
        )
    return factory


def _load_tokenizer(name: Any, **kwargs: Any) -> Any:
    if not name:
        raise SpecDecError("a datastore must be checked against the engine's tokenizer, and the engine names none")
    try:
        return AutoTokenizer.from_pretrained(name, **kwargs)
    except (OSError, ValueError) as error:
        raise SpecDecError(f"cannot load the tokenizer {name!r} to check the datastore against it: {error}") from error


def engine_args(
    drafter: str = DEFAULT_DRAFTER,
    num_speculative_tokens: int = DEFAULT_NUM_SPECULATIVE_TOKENS,
    *,
    tokenizer: Any = None,
    min_accept: float = DEFAULT_MIN_ACCEPT,
    stats_path: str | os.PathLike[str] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """``speculative_config`` and ``additional_config`` for ``vllm.LLM(...)`` or ``AsyncEngineArgs``.

    ``drafter`` and ``options`` as :func:`specdec.drafters.make_factory` takes them (a
    composite's part options nested, ``sam={"datastore": PATH}``, or dotted,
    ``**{"sam.datastore": PATH}``). The drafter is built here once, so a bad name, option
    or datastore raises :class:`SpecDecError` before any engine starts; with
    ``tokenizer`` (a checkpoint path or a tokenizer object: the engine's) datastores are
    checked against it here too, else only at engine start. ``min_accept`` and
    ``stats_path``: the proposer's own settings (:class:`DrafterSpec`). Merge the returned
    ``additional_config`` with your own if you pass one.

    >>> engine_args("pld", 4)["speculative_config"]
    {'method': 'custom_class', 'model': 'specdec.integrations.vllm.Proposer', 'num_speculative_tokens': 4}
    """
    if isinstance(num_speculative_tokens, bool) or not isinstance(num_speculative_tokens, int) \
            or num_speculative_tokens < 1:
        raise SpecDecError(f"num_speculative_tokens must be a positive int, got {num_speculative_tokens!r}")
    spec = DrafterSpec.from_json({"drafter": drafter, "options": options, "min_accept": min_accept,
                                  **({} if stats_path is None else {"stats_path": stats_path})})
    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = _load_tokenizer(str(tokenizer))
    vocab_size = len(tokenizer) if tokenizer is not None else None
    build_factory(spec, DrafterContext(vocab_size=vocab_size, tokenizer=tokenizer))
    return {
        "speculative_config": {"method": "custom_class", "model": PROPOSER,
                               "num_speculative_tokens": num_speculative_tokens},
        "additional_config": {CONFIG_KEY: spec.to_json()},
    }


def serve_flags(drafter: str = DEFAULT_DRAFTER, num_speculative_tokens: int = DEFAULT_NUM_SPECULATIVE_TOKENS,
                **options: Any) -> list[str]:
    """The same as :func:`engine_args`, as ``vllm serve`` flags (one list item per argument)."""
    args = engine_args(drafter, num_speculative_tokens, **options)
    return ["--speculative-config", json.dumps(args["speculative_config"]),
            "--additional-config", json.dumps(args["additional_config"])]


# -- chains from trees --------------------------------------------------------------------


class PathChoice(NamedTuple):
    """What :func:`best_path` found: the path to send, the path ``min_accept`` would not have
    cut (the same when it cut nothing), both root first, and the acceptance keys of all nodes."""

    path: list[int]
    uncut: list[int]
    keys: list[NodeKey]


def best_path(tree: DraftTree, max_tokens: int, model: AcceptanceModel, min_accept: float = 0.0,
              memo: dict[NodeKey, float] | None = None) -> PathChoice:
    """The path of ``tree`` from the root that ``model`` expects to be accepted longest. O(N).

    Only nodes at most ``max_tokens`` deep whose probability of acceptance ``p_i`` is at
    least ``min_accept`` count (they form a subtree: ``p`` never grows from a parent to its
    child); ``[0]`` means nothing is worth sending. A path's expected accepted tokens are
    the sum of ``p_i`` along it; ties go to the lower node index (the drafter's order).
    ``memo``: as in :meth:`AcceptanceModel.estimate_lists`.
    """
    keys = node_keys(tree)
    _, probs = model.estimate_lists(tree, keys, memo)
    size = len(probs)
    score = [1.0] * size  # score[i]: expected accepted nodes on the path root..i (root included)
    parents, depths = tree.parents, tree.depths
    best = uncut = 0
    for i in range(1, size):
        if depths[i] > max_tokens:
            continue  # (so are its descendants)
        score[i] = score[parents[i]] + probs[i]
        if score[i] > score[uncut]:
            uncut = i
        if probs[i] >= min_accept and score[i] > score[best]:  # (a node below the cut has no descendant above it)
            best = i
    path = tree.path_to(best)
    return PathChoice(path, path if uncut == best else tree.path_to(uncut), keys)


def chain_of(tree: DraftTree, path: list[int], keys: list[NodeKey]) -> tuple[DraftTree, list[NodeKey]]:
    """The chain of ``tree``'s nodes ``path`` (from the root), with those nodes' keys. Keys keep
    each node's rank among its siblings in ``tree``, so the model learns how the drafter's
    second choices fare."""
    if path[-1] == len(path) - 1:  # the path is the tree's first nodes (always so for a chain)
        return tree.prefix(len(path)), keys[: len(path)]
    return tree.select(path), [keys[i] for i in path]


def best_chain(tree: DraftTree, max_tokens: int, model: AcceptanceModel, min_accept: float = 0.0,
               memo: dict[NodeKey, float] | None = None) -> tuple[DraftTree, list[NodeKey]]:
    """:func:`best_path` as a chain (:func:`chain_of`). O(N).

    >>> tree = DraftTree((0, 1, 2, 3), (-1, 0, 0, 2))  # root -> 1 and root -> 2 -> 3
    >>> model = AcceptanceModel(prior=0.5)  # nothing learned: every conditional acceptance is 0.5
    >>> best_chain(tree, 8, model)[0].tokens, best_chain(tree, 8, model, min_accept=0.5)[0].tokens
    ((0, 2, 3), (0, 1))
    """
    choice = best_path(tree, max_tokens, model, min_accept, memo)
    return chain_of(tree, choice.path, choice.keys)


# -- per-request state --------------------------------------------------------------------


class _Request:
    """One request's drafter and what identifies its context (see the module docstring)."""

    __slots__ = ("chain", "chain_keys", "committed", "drafter", "head", "pending", "stamp", "tail")

    def __init__(self, drafter: Drafter, tokens: TokenRow, length: int) -> None:
        self.drafter = drafter
        committed = length - 1
        drafter.reset(tokens[:committed].tolist())  # O(n) once per request
        self.head: list[int] = tokens[: min(committed, CHECK_TOKENS)].tolist()
        self.chain: DraftTree | None = None  # the chain last sent, and its nodes' acceptance keys
        self.chain_keys: list[NodeKey] = []
        self.stamp = 0  # the call that detached this state
        self._remember(tokens, length)

    def _remember(self, tokens: TokenRow, length: int) -> None:
        committed = length - 1
        self.committed = committed
        self.pending = int(tokens[committed])
        self.tail: list[int] = tokens[max(0, committed - CHECK_TOKENS) : committed].tolist()

    def extended_by(self, tokens: TokenRow, length: int) -> bool:
        """Whether ``tokens[:length]`` continues this state's context. O(CHECK_TOKENS)."""
        committed = self.committed
        return (
            length - 1 > committed
            and int(tokens[committed]) == self.pending
            and tokens[: len(self.head)].tolist() == self.head
            and tokens[committed - len(self.tail) : committed].tolist() == self.tail
        )

    def advance(self, tokens: TokenRow, length: int, model: AcceptanceModel) -> int:
        """Commit the row's new tokens (the old pending first); returns the accepted draft tokens
        of the last chain sent (0 when none was sent), after teaching ``model`` about them."""
        new = tokens[self.committed : length - 1].tolist()
        accepted = 0
        chain = self.chain
        if chain is not None:
            draft = chain.tokens
            limit = min(len(draft), len(new))
            while accepted + 1 < limit and new[accepted + 1] == draft[accepted + 1]:
                accepted += 1
            model.observe(chain, self.chain_keys, tuple(range(accepted + 1)))
            self.chain = None
        self.drafter.update(new, None)
        self._remember(tokens, length)
        return accepted


@dataclass
class ProposerStats:
    """Counters of one proposer (one worker). ``seconds`` is host time inside :meth:`Proposer.propose`."""

    calls: int = 0
    rows: int = 0  # rows that got a proposal (drafted or not)
    drafted_rows: int = 0  # rows that got at least one draft token
    draft_tokens: int = 0
    accepted_tokens: int = 0  # draft tokens of earlier chains seen accepted
    fresh_states: int = 0
    moved_states: int = 0  # states found again in another row
    probes: int = 0  # drafts sent past the min_accept cut, so that the acceptance model keeps learning
    seconds: float = 0.0
    fresh_seconds: float = 0.0  # of which building fresh states (O(context), once per request)
    max_call_seconds: float = 0.0


class Proposer:
    """vLLM's ``custom_class`` proposer running a specdec retrieval drafter (module docstring).

    ``Proposer(vllm_config)`` reads ``speculative_config.num_speculative_tokens``,
    ``model_config.max_model_len`` and ``additional_config["specdec"]``, and builds the
    drafter factory (bad input raises :class:`SpecDecError` here, at engine start).
    """

    STATS_EVERY = 16

    def __init__(self, vllm_config: Any) -> None:
        speculative_config = getattr(vllm_config, "speculative_config", None)
        k = getattr(speculative_config, "num_speculative_tokens", None)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise SpecDecError(f"speculative_config.num_speculative_tokens must be a positive int, got {k!r}")
        self.num_speculative_tokens = k
        model_config = vllm_config.model_config
        self.max_model_len = int(model_config.max_model_len)
        additional = getattr(vllm_config, "additional_config", None)
        entry = additional.get(CONFIG_KEY) if isinstance(additional, Mapping) else None
        self.spec = DrafterSpec.from_json(entry)
        tokenizer = None
        if self.spec.needs_tokenizer:
            tokenizer = _load_tokenizer(
                getattr(model_config, "tokenizer", None) or model_config.model,
                revision=getattr(model_config, "tokenizer_revision", None),
                trust_remote_code=bool(getattr(model_config, "trust_remote_code", False)),
            )
        self.acceptance = AcceptanceModel(prior=ACCEPTANCE_PRIOR)
        # The acceptance model is lent to the drafters too (composites order merged trees by it).
        context = DrafterContext(vocab_size=int(model_config.get_vocab_size()), tokenizer=tokenizer,
                                 acceptance=self.acceptance)
        self.factory = build_factory(self.spec, context)
        self.stats = ProposerStats()
        self._rows: dict[int, _Request] = {}
        self._detached: list[_Request] = []
        self._since_probe = 0  # drafts min_accept cut since the last probe

    # -- vLLM's entry points --------------------------------------------------------------
    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load (a retrieval drafter runs no model); vLLM's CPU runner calls it all the same."""
        del args, kwargs

    def propose(
        self,
        sampled_token_ids: Sequence[Sequence[int]],
        num_tokens_no_spec: npt.NDArray[Any],
        token_ids_cpu: npt.NDArray[Any],
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        """One chain of draft token ids per batch row (empty: no draft); see the module docstring.

        ``sampled_token_ids``: ``num_rows`` lists; ``num_tokens_no_spec``: int
        ``[>= num_rows]``; ``token_ids_cpu``: int ``[>= num_rows, max_model_len]``.
        """
        del slot_mappings  # vLLM's slots for drafters that run a model; a retrieval drafter has none
        started = time.perf_counter()
        stats = self.stats
        stats.calls += 1
        clock = stats.calls
        num_rows = len(sampled_token_ids)
        drafts: list[list[int]] = [[] for _ in range(num_rows)]
        for row in [row for row in self._rows if row >= num_rows]:  # requests gone, or moved up the batch
            self._detach(self._rows.pop(row), clock)
        live: list[tuple[int, int, _Request | None]] = []  # (row, length, state if the row extends it)
        for row in range(num_rows):
            if not sampled_token_ids[row]:
                continue  # nothing new in this row this step: no draft, its state kept as it is
            length = int(num_tokens_no_spec[row])
            request = self._rows.get(row)
            if request is not None and not request.extended_by(token_ids_cpu[row], length):
                self._detach(self._rows.pop(row), clock)
                request = None
            live.append((row, length, request))
        ready: list[tuple[int, int, _Request]] = []
        for row, length, request in live:
            tokens = token_ids_cpu[row]
            if request is None:
                request = self._rows[row] = self._claim(tokens, length)
            if request.committed < length - 1:  # a fresh state holds the whole context already
                stats.accepted_tokens += request.advance(tokens, length, self.acceptance)
            ready.append((row, length, request))
        # Every row has taught the acceptance model what vLLM accepted: from here on it learns
        # nothing in this call, so one memo of conditional acceptances serves every row.
        memo: dict[NodeKey, float] = {}
        for row, length, request in ready:
            budget = min(self.num_speculative_tokens, self.max_model_len - length)
            stats.rows += 1
            if budget > 0:
                drafts[row] = self._draft(request, budget, memo)
        self._free_detached(clock)
        elapsed = time.perf_counter() - started
        stats.seconds += elapsed
        stats.max_call_seconds = max(stats.max_call_seconds, elapsed)
        if self.spec.stats_path is not None and clock % self.STATS_EVERY == 0:
            self.write_stats()
        return drafts

    # -- states ---------------------------------------------------------------------------
    def _detach(self, request: _Request, clock: int) -> None:
        request.stamp = clock
        self._detached.append(request)

    def _free_detached(self, clock: int) -> None:
        """Drop the states detached before the previous call: their requests ended (or were
        preempted, and will get a fresh state). A drafter with ``finish()`` (``sam``) hands its
        sequence to the store it shares with the other requests."""
        kept = []
        for request in self._detached:
            if request.stamp >= clock - 1:
                kept.append(request)
                continue
            finish = getattr(request.drafter, "finish", None)
            if callable(finish):
                finish()
        self._detached = kept

    def _claim(self, tokens: TokenRow, length: int) -> _Request:
        """A detached state this row extends (its request moved rows), else a fresh one."""
        for index, request in enumerate(self._detached):
            if request.extended_by(tokens, length):
                del self._detached[index]
                self.stats.moved_states += 1
                return request
        started = time.perf_counter()
        request = _Request(self.factory.create(), tokens, length)
        self.stats.fresh_states += 1
        self.stats.fresh_seconds += time.perf_counter() - started
        return request

    def _draft(self, request: _Request, budget: int, memo: dict[NodeKey, float]) -> list[int]:
        tree = request.drafter.propose(request.pending, budget + 1)
        if tree.size == 1:
            return []
        path, uncut, keys = best_path(tree, budget, self.acceptance, self.spec.min_accept, memo)
        if len(uncut) > len(path):  # min_accept cut the draft: now and then, probe past the cut
            self._since_probe += 1
            if self._since_probe >= PROBE_EVERY:
                self._since_probe = 0
                self.stats.probes += 1
                path = uncut[: max(2, 2 * len(path) - 1)]  # twice the draft tokens, at least one
        if len(path) == 1:
            return []
        chain, chain_keys = chain_of(tree, path, keys)
        request.chain, request.chain_keys = chain, chain_keys
        self.stats.drafted_rows += 1
        self.stats.draft_tokens += chain.size - 1
        return list(chain.tokens[1:])

    # -- reports --------------------------------------------------------------------------
    def drafter_of(self, row: int) -> Drafter | None:
        """The drafter serving batch row ``row`` now, if any (tests, introspection)."""
        request = self._rows.get(row)
        return None if request is None else request.drafter

    @property
    def num_states(self) -> int:
        """Per-request states held now (rows and detached), for tests and memory checks."""
        return len(self._rows) + len(self._detached)

    def summary(self) -> dict[str, Any]:
        """The counters, with host microseconds per row-proposal and the mean chain sent."""
        stats = self.stats
        rows = max(stats.rows, 1)
        return {
            "drafter": self.spec.drafter,
            "num_speculative_tokens": self.num_speculative_tokens,
            **stats.__dict__,
            "us_per_row": round(1e6 * stats.seconds / rows, 2),
            # the same without building fresh states: the per-step cost
            "us_per_row_step": round(1e6 * (stats.seconds - stats.fresh_seconds) / rows, 2),
            "mean_draft": round(stats.draft_tokens / stats.drafted_rows, 3) if stats.drafted_rows else None,
        }

    def write_stats(self) -> None:
        """Rewrite ``stats_path`` with :meth:`summary` (atomically: a reader never sees half a file)."""
        if self.spec.stats_path is None:
            return
        write_atomically(self.spec.stats_path, json.dumps(self.summary(), indent=1))
