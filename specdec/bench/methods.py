"""The methods a benchmark compares: specdec drafters and Hugging Face's own decoding.

A method is named by a **spec** string: ``[label=]name[:key=value[:key=value...]]``.

- ``name`` is a registered drafter (``specdec.available_drafters()``: ``none``, ``pld``,
  ...; composites ``a+b``) run through specdec's loop, or a peer from :data:`PEERS`, run
  through ``model.generate``: ``hf-generate`` (plain greedy decoding), ``hf-pld`` (its
  prompt lookup) and ``hf-static`` (greedy decoding on a static KV cache, compiled).
- ``key=value`` pairs: values parse as JSON when they can (``pld:num_draft=6``), else stay
  strings (``rest:datastore=gsm8k.rest``). For a drafter, a key that
  :meth:`specdec.Generator.generate` takes goes there (``budget``, ``max_nodes``,
  ``prompt_feedback``, the sampling options ``do_sample``, ``temperature``, ``top_k``,
  ``top_p``, ``seed``), a key that the :class:`~specdec.Generator` constructor takes goes
  there (``engine``, ``tree_ops``, ``store``, ...; ``planner_cache`` is off unless the spec
  turns it on, so a run does not depend on what earlier processes learned), ``keep=true``
  keeps one drafter object (and what it learns) across all questions, and every other key
  is a drafter option. A sampled method's output is judged against ``none`` with the same sampling
  options, which must be among the methods. A peer takes the options its row in
  :data:`PEERS` lists.
- ``label`` names the method in tables (default: the spec itself), so one drafter can
  appear twice with two settings: ``pld6=pld:num_draft=6``.

Every method is measured the same way, by hooks on the target model's ``forward``
(:class:`ForwardMeter`): the number of target forwards and the time spent inside them.
So MAT means the same thing for a peer as for specdec (tokens emitted per target forward
after the prefill, bonus included), and ``wall - forward time`` is each method's own host
overhead. The exception is a compiled peer: hooks inside a compiled forward would break
its graph, so they are paused and its forwards counted from its output (plain decoding
runs one per token), with no forward time.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import torch
from transformers import CompileConfig

from specdec.api import Generator
from specdec.backends.specdec_engine.forward import SpecdecForward
from specdec.datastores.format import read_header
from specdec.decoding import DECODING_OPTIONS, DecodingConfig, StopRules
from specdec.drafters import DrafterContext, make_factory
from specdec.engine import decode
from specdec.errors import SpecDecError
from specdec.models import eos_token_ids
from specdec.sampling import Decision, resolve_decision
from specdec.types import Drafter, DraftTree


@dataclass(frozen=True)
class Peer:
    """A decoding method of Hugging Face's, run as ``model.generate(ids, **arguments)``.

    ``options`` maps each spec option to the ``generate`` argument it sets; ``arguments``
    are always passed (before the options); ``compiled`` peers run a compiled forward
    (see :meth:`HuggingFaceMethod.generate_kwargs`).
    """

    name: str
    about: str
    options: Mapping[str, str] = field(default_factory=dict)
    arguments: Mapping[str, Any] = field(default_factory=dict)
    compiled: bool = False


# The peers, one row each: a new peer is a new row (and, if it needs one, a generate argument).
PEERS: dict[str, Peer] = {peer.name: peer for peer in (
    Peer("hf-generate", "model.generate, greedy"),
    Peer("hf-pld", "model.generate with prompt lookup (prompt_lookup_num_tokens=10)",
         {"num_tokens": "prompt_lookup_num_tokens", "max_ngram": "max_matching_ngram_size"},
         {"prompt_lookup_num_tokens": 10}),
    Peer("hf-static", "model.generate, greedy, cache_implementation='static', the decoding forward torch.compile'd "
         "(compile=false: the static cache alone)", {"compile": "compile"}, {"cache_implementation": "static"},
         compiled=True),
)}
# Greedy baselines: their output is plain decoding by definition, so identity is judged against them.
GREEDY_BASELINES = ("none", "hf-generate")
SAMPLING_OPTIONS = ("do_sample", "temperature", "top_k", "top_p", "seed")
KEEP = "keep"  # the bench's own option: one drafter object across all questions
# Generator.generate arguments a spec must not set: the benchmark sets them (or they are no decoding option).
_NOT_OPTIONS = {"self", "prompt", "max_new_tokens", "on_tokens", "chat_template", "stop", "eos_token_id",
                "ignore_eos", "model", "tokenizer", "drafter", "drafter_options", "datastore"}


def generator_options() -> tuple[frozenset[str], frozenset[str]]:
    """``(construction, generation)``: the spec options :class:`~specdec.Generator` takes, read from it.

    Read from the constructor's signature and the decoding options' type
    (:class:`~specdec.decoding.DecodingOptions`), so an option the library adds (a
    ``engine`` for the constructor, say) is a bench option the day it lands.
    """
    construction = set(inspect.signature(Generator.__init__).parameters) - _NOT_OPTIONS
    generation = set(DECODING_OPTIONS) - _NOT_OPTIONS
    return frozenset(construction - generation), frozenset(generation)


@dataclass(frozen=True)
class MethodSpec:
    """A parsed method spec: what to run (``name`` with ``options``) and what to call it."""

    label: str
    name: str
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def is_peer(self) -> bool:
        """Run through ``model.generate`` rather than specdec's loop."""
        return self.name in PEERS

    @property
    def is_greedy_baseline(self) -> bool:
        return self.name in GREEDY_BASELINES and not self.options

    @property
    def sampling(self) -> dict[str, Any]:
        """The sampling options (empty for greedy decoding)."""
        return {k: v for k, v in self.options.items() if k in SAMPLING_OPTIONS}

    @property
    def is_sampled_baseline(self) -> bool:
        """Plain decoding with sampling options only: the reference for methods sampling alike."""
        return self.name == "none" and bool(self.options) and set(self.options) <= set(SAMPLING_OPTIONS)

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "name": self.name, "options": dict(self.options)}


def parse_method(spec: str) -> MethodSpec:
    """Parse ``[label=]name[:key=value...]``; a malformed spec is an error that quotes it.

    >>> parse_method("pld6=pld:num_draft=6")
    MethodSpec(label='pld6', name='pld', options={'num_draft': 6})
    """
    text = spec.strip()
    head, _, rest = text.partition(":")
    label, sep, name = head.partition("=")
    if not sep:
        label, name = text, head
    label, name = label.strip(), name.strip().lower()
    if not name or not label:
        raise SpecDecError(f"method spec {spec!r} has an empty {'name' if not name else 'label'}")
    options: dict[str, Any] = {}
    for pair in rest.split(":") if rest else []:
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise SpecDecError(f"method spec {spec!r}: option {pair!r} is not key=value")
        try:
            options[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            options[key.strip()] = value
    # A drafter name (composites included) is checked by the registry when the method is built.
    if name in PEERS:
        unknown = sorted(set(options) - set(PEERS[name].options))
        if unknown:
            valid = ", ".join(PEERS[name].options) or "none"
            raise SpecDecError(f"method spec {spec!r}: {name} has no option {unknown[0]!r}; valid options: {valid}")
    return MethodSpec(label, name, options)


def parse_methods(specs: Sequence[str]) -> list[MethodSpec]:
    """Parse comma-separated method lists (each item one spec); labels must be unique."""
    methods = [parse_method(item) for text in specs for item in text.split(",") if item.strip()]
    if not methods:
        raise SpecDecError("no methods to benchmark: give at least one, e.g. --drafters none,pld")
    labels = [m.label for m in methods]
    for label in labels:
        if labels.count(label) > 1:
            raise SpecDecError(f"method label {label!r} appears twice: name one of them with label=spec")
    return methods


class ForwardMeter:
    """Counts the target model's forwards and the wall time spent inside them.

    Installs a pre-hook and a hook on the model's top-level module, which every caller
    (specdec's verifier, ``model.generate``) runs through ``__call__``; a verifier whose forwards
    are specdec's own (``engine="specdec"``: they never call the model's ``__call__``) is watched
    through :meth:`watch`. On a GPU the hooks
    synchronize, so the time is the kernels' and not the launch's; that sync is a cost
    every method pays alike. Hooks add ~2 us per forward.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.forwards = 0
        self.forward_s = 0.0
        self._model = model
        self._started = 0.0
        self._cuda = next(model.parameters()).device.type == "cuda"
        self._handles: list[Any] = []
        self._install()

    def _install(self) -> None:
        self._handles = [
            self._model.register_forward_pre_hook(self._before),
            self._model.register_forward_hook(self._after),
        ]

    def _before(self, module: Any, args: Any) -> None:
        if self._cuda:
            torch.cuda.synchronize()
        self._started = time.perf_counter()

    def _after(self, module: Any, args: Any, output: Any) -> None:
        if self._cuda:
            torch.cuda.synchronize()
        self.forward_s += time.perf_counter() - self._started
        self.forwards += 1

    def snapshot(self) -> tuple[int, float]:
        return self.forwards, self.forward_s

    def watch(self, verifier: Any) -> None:
        """Also count the forwards of ``verifier``'s own runner (``engine="specdec"``), if it has one.

        The runner object is specdec's, not the user's model: its ``forward`` is wrapped in place.
        """
        forward = getattr(verifier, "forward", None)
        if not isinstance(forward, SpecdecForward):  # a static cache's `runner` is a method: its forwards are
            return  # the model's own, which the hooks count already
        runner: Any = forward.runner  # wrapped in place below (specdec's object, not the user's)
        if getattr(runner, "metered", False):
            return
        inner = runner.forward_rows  # every runner forward (a lone sequence's, a batch's) goes through it

        def forward_rows(*args: Any, **kwargs: Any) -> Any:
            self._before(None, None)
            try:
                return inner(*args, **kwargs)
            finally:
                self._after(None, None, None)

        runner.forward_rows = forward_rows
        runner.metered = True

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No hooks inside: a compiled forward would trace them (graph breaks, host syncs)."""
        handles = self._handles
        self.close()
        try:
            yield
        finally:
            if handles:
                self._install()

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


@dataclass
class Measurement:
    """One generation, as a benchmark records it.

    ``forwards``: target forwards that decoded (the prefill and ``steps`` verification
    steps); ``emitted_by_steps``: tokens the steps emitted (the output minus the prefill's
    token), so ``mat = emitted_by_steps / steps`` for every method alike. ``forward_s``:
    time inside those forwards (None where they were not hooked).
    ``draft_s``/``verify_s``/``prefill_s``/``other_s`` come from specdec's own stats and are
    None for the peers. ``trees``: the trees a sampled specdec method verified, in order,
    for the judge, and ``kernels`` the kernel choice each of its forwards ran (not saved).

    ``calibration_s`` and ``extra_forwards``: a one-time measurement of the verifier's
    cost (the draft budget planner's calibration, on its first draft in a process) runs
    forwards that are not decoding. They are taken out of ``wall_s``, ``forward_s`` and
    ``forwards`` and recorded apart; the runner's warm-up normally absorbs them.
    """

    tokens: list[int]
    wall_s: float
    forwards: int
    forward_s: float | None
    emitted_by_steps: int
    stop_reason: str
    calibration_s: float = 0.0
    extra_forwards: int = 0
    tree_nodes: int | None = None  # nodes verified over all steps (specdec's stats)
    prefill_s: float | None = None
    draft_s: float | None = None
    verify_s: float | None = None
    other_s: float | None = None
    sources: dict[str, dict[str, int]] | None = None  # {"steps": by source, "accepted": by source} (specdec)
    trees: list[DraftTree] | None = None
    kernels: list[Any] | None = None  # with trees: the kernels of the prefill, then of each tree (not saved)

    @property
    def new_tokens(self) -> int:
        return len(self.tokens)

    @property
    def steps(self) -> int:
        return max(0, self.forwards - 1)


class Method(Protocol):
    spec: MethodSpec

    def generate(self, prompt: Sequence[int], max_new_tokens: int) -> Measurement: ...


class _TreeLog:
    """A verifier seen through a window that keeps every tree it verifies, and the kernels each forward ran
    (the prefill's first, then each tree's), so a redo runs the same forwards (attributes pass through).

    Kernels are recorded because the cost model may recalibrate in the middle of a run (when steps
    take far longer than calibrated: a busy machine) and pick other kernels, whose logits differ in
    the last bits; a redo with the later choice would not reproduce the earlier draws.
    """

    def __init__(self, verifier: Any) -> None:
        object.__setattr__(self, "_inner", verifier)
        object.__setattr__(self, "trees", [])
        object.__setattr__(self, "forward_kernels", [])  # not `kernels`: that is the verifier's, passed through

    def prefill(self, *args: Any, **kwargs: Any) -> Any:
        self.forward_kernels.append(self._inner.kernels)
        return self._inner.prefill(*args, **kwargs)

    def verify(self, state: Any, tree: DraftTree, topk: int = 0, features: bool = False) -> Any:
        self.trees.append(tree)
        self.forward_kernels.append(self._inner.kernels)
        return self._inner.verify(state, tree, topk, features)

    def clear(self) -> None:
        self.trees.clear()
        self.forward_kernels.clear()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)


class _Kept:
    """A drafter factory whose ``create`` returns one object until :meth:`renew` (``keep=true``)."""

    def __init__(self, factory: Any) -> None:
        self._factory = factory
        self.name = factory.name
        self.drafter: Drafter = factory.create()

    def create(self) -> Drafter:
        return self.drafter

    def renew(self) -> None:
        self.drafter = self._factory.create()


class SpecdecMethod:
    """A registered drafter through specdec's loop (a fresh drafter per generation, unless ``keep``)."""

    def __init__(self, spec: MethodSpec, model: Any, tokenizer: Any, meter: ForwardMeter, tree_ops: str,
                 datastores: Mapping[str, str] | None = None) -> None:
        self.spec = spec
        self._meter = meter
        construction, generation = generator_options()
        self._generation = {k: v for k, v in spec.options.items() if k in generation}
        built = {"tree_ops": tree_ops, **{k: v for k, v in spec.options.items() if k in construction}}
        if "planner_cache" in construction:  # a run must not depend on what earlier processes learned
            built.setdefault("planner_cache", False)
        options = {k: v for k, v in spec.options.items() if k not in construction | generation | {KEEP}}
        options = with_datastores(spec.name, options, datastores or {})
        self._generator = Generator(model, tokenizer, drafter=spec.name, drafter_options=options, **built)
        self._kept: _Kept | None = None
        if spec.options.get(KEEP):
            self._kept = _Kept(make_factory(spec.name, options, self._generator.context))
            self._generator.close()  # its verifier's device state (a GPU's captured graphs) goes to the next
            self._generator = Generator(model, tokenizer, drafter=self._kept, **built)
        meter.watch(self._generator.verifier)
        self._trees: _TreeLog | None = None
        if spec.sampling:  # the judge redoes a sampled run's forwards from its trees
            self._trees = _TreeLog(self._generator.verifier)
            self._generator.verifier = cast(Any, self._trees)
            self._feedback_topk = self._generator.new_drafter().feedback_topk

    def prepare(self, max_tokens: int | None = None) -> None:
        """Pay one-time costs now: the budget planner's calibration, on its first use in a process
        (every budget needs it: the calibration also picks the verifier's kernels), and with
        ``max_tokens`` the static cache's compiled forwards for sequences that long.
        """
        self._generator.cost_model()
        if max_tokens is not None:
            self._generator.warm_up(max_tokens)

    def after_warmup(self) -> None:
        """A kept drafter starts the timed questions fresh: what it learned in the warm-up is dropped."""
        if self._kept is not None:
            self._kept.renew()

    def generate(self, prompt: Sequence[int], max_new_tokens: int) -> Measurement:
        forwards, forward_s = self._meter.snapshot()
        if self._trees is not None:
            self._trees.clear()
        result = self._generator.generate(list(prompt), max_new_tokens=max_new_tokens, **self._generation)
        stats = result.stats
        calibration_s = float(getattr(stats, "calibration_s", 0.0))
        hooked = self._meter.forwards - forwards
        return Measurement(
            tokens=list(result.tokens),
            wall_s=stats.total_s - calibration_s,
            forwards=stats.steps + 1,
            forward_s=max(0.0, self._meter.forward_s - forward_s - calibration_s),
            emitted_by_steps=stats.emitted_by_steps,
            calibration_s=calibration_s,
            extra_forwards=hooked - (stats.steps + 1),
            stop_reason=stats.stop_reason,
            tree_nodes=sum(r.tree_size for r in stats.records),
            prefill_s=stats.prefill_s,
            draft_s=stats.draft_s,
            verify_s=stats.verify_s,
            other_s=stats.other_s,
            sources={"steps": stats.steps_by_source, "accepted": stats.accepted_by_source},
            trees=None if self._trees is None else list(self._trees.trees),
            kernels=None if self._trees is None else list(self._trees.forward_kernels),
        )

    def redo(self, prompt: Sequence[int], measurement: Measurement, max_new_tokens: int,
             position: int) -> torch.Tensor | None:
        """The logits row that decided the token at absolute ``position`` in a sampled run, redone.

        Runs the loop again over the same verifier with the run's own trees (recorded by
        :meth:`generate`), so the forwards are the run's: same shapes, same kernels, same
        inputs. float ``[V]`` as the sampler saw it (after any repetition penalty), or None
        when the redo does not reproduce the run's output up to ``position``.
        """
        if measurement.trees is None:
            raise SpecDecError(f"method {self.spec.label!r} recorded no trees (it does not sample)")
        generator = self._generator
        decision = resolve_decision(None, **self.spec.sampling)  # as Generator.generate resolves it
        capture = _Capture(decision.chooser, position)
        decision = Decision(cast(Any, capture), decision.repetition_penalty, decision.seed)
        drafter = _Script(measurement.trees, self._feedback_topk, capture)
        rules = StopRules(max_new_tokens, frozenset(eos_token_ids(generator.model, generator.tokenizer)))
        inner = self._trees._inner if self._trees is not None else generator.verifier
        kept = inner.kernels
        verifier = _Replay(inner, measurement.kernels or [])
        try:
            config = DecodingConfig(rules, decision, prompt_feedback=bool(self._generation.get("prompt_feedback")))
            redone = decode(cast(Any, verifier), cast(Drafter, drafter), list(prompt), config)
        except _Diverged:
            return None
        finally:
            inner.use_kernels(kept)
        index = position - len(prompt)
        if capture.row is None or redone.tokens[: index + 1] != measurement.tokens[: index + 1]:
            return None
        return capture.row


class _Replay:
    """A verifier that runs each forward of a redo with the kernels the run's same forward ran
    (:class:`_TreeLog`; attributes pass through)."""

    def __init__(self, verifier: Any, kernels: Sequence[Any]) -> None:
        self._inner, self._kernels, self._next = verifier, list(kernels), 0

    def _use_next(self) -> None:
        if self._next < len(self._kernels):
            self._inner.use_kernels(self._kernels[self._next])
        self._next += 1

    def prefill(self, *args: Any, **kwargs: Any) -> Any:
        self._use_next()
        return self._inner.prefill(*args, **kwargs)

    def verify(self, state: Any, tree: DraftTree, topk: int = 0, features: bool = False) -> Any:
        self._use_next()
        return self._inner.verify(state, tree, topk, features)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Diverged(Exception):
    """A redo's pending token is not the recorded tree's root: the run is not reproduced."""


class _Capture:
    """A token chooser that keeps the logits rows deciding ``position``; :class:`_Script` names the one kept."""

    def __init__(self, chooser: Any, position: int) -> None:
        self.chooser, self.name, self.position = chooser, chooser.name, position
        self.candidates: dict[int, torch.Tensor] = {}
        self.row: torch.Tensor | None = None

    def choose(self, logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hits = (positions == self.position).nonzero().flatten().tolist()
        self.candidates = {int(i): logits[i].detach().clone() for i in hits}
        if self.row is None and positions.numel() == 1 and self.candidates:  # the prefill's (or a 1-node step's)
            self.row = self.candidates[0]
        return cast(torch.Tensor, self.chooser.choose(logits, positions))


class _Script:
    """A drafter that proposes recorded trees in order, and tells :class:`_Capture` which row was committed."""

    name = "script"

    def __init__(self, trees: Sequence[DraftTree], feedback_topk: int, capture: _Capture) -> None:
        self._trees, self._next, self.feedback_topk, self._capture = list(trees), 0, feedback_topk, capture

    def reset(self, prompt: Any, feedback: Any = None) -> None:
        self._next = 0

    def propose(self, pending: int, max_nodes: int) -> DraftTree:
        if self._next >= len(self._trees) or self._trees[self._next].tokens[0] != pending:
            raise _Diverged
        self._next += 1
        return self._trees[self._next - 1]

    def update(self, accepted: Sequence[int], feedback: Any) -> None:
        tree, node = self._trees[self._next - 1], 0
        children = tree.children()
        path = [0]
        for token in accepted[1:]:
            node = children[node][token]
            path.append(node)
        capture = self._capture
        if capture.row is None:
            capture.row = next((capture.candidates[n] for n in path if n in capture.candidates), None)


def drafter_context(model: Any, tokenizer: Any) -> Any:
    """What drafter factories may know of the target, as :class:`~specdec.api.Generator` builds it."""
    vocab = int(model.get_output_embeddings().weight.shape[0])
    return DrafterContext(vocab_size=vocab, tokenizer=tokenizer, eos_token_ids=eos_token_ids(model, tokenizer),
                          model=model)


def datastore_kinds(paths: Sequence[str | os.PathLike[str]]) -> dict[str, str]:
    """``{kind: path}`` from the datastore files' own headers (``rest``, ``sam``, ...).

    A datastore's kind is the name of the drafter that reads it, so ``--datastore`` needs
    no ``drafter=`` prefix. Two files of one kind are an error: which would go where?
    """
    kinds: dict[str, str] = {}
    for path in paths:
        kind = str(read_header(path).get("kind", ""))
        if kind in kinds:
            raise SpecDecError(f"two {kind!r} datastores given ({kinds[kind]} and {os.fspath(path)}): keep one")
        kinds[kind] = os.fspath(path)
    return kinds


def with_datastores(name: str, options: Mapping[str, Any], datastores: Mapping[str, str]) -> dict[str, Any]:
    """``options`` plus the datastore of the drafter's kind, or of each composite part's kind.

    An explicit option (``rest:datastore=...``, ``sam+recycling:sam.datastore=...``) wins.
    """
    merged = dict(options)
    if "+" not in name:
        if name in datastores and "datastore" not in merged:
            merged["datastore"] = datastores[name]
        return merged
    for part in name.split("+"):
        if part in datastores and f"{part}.datastore" not in merged and not isinstance(merged.get(part), Mapping):
            merged[f"{part}.datastore"] = datastores[part]
    return merged


def peer_arguments(peer: Peer, options: Mapping[str, Any]) -> dict[str, Any]:
    """The ``generate`` arguments of ``peer`` with a spec's ``options`` (end-of-sequence and pad ids aside).

    A compiled peer (``hf-static``) gets transformers' default ``CompileConfig`` flagged for
    every device (:meth:`HuggingFaceMethod.generate_kwargs` says why), or ``disable_compile``
    with ``compile=false``.
    """
    kwargs: dict[str, Any] = dict(peer.arguments)
    for key, value in options.items():
        kwargs[peer.options[key]] = value
    if peer.compiled:
        if kwargs.pop("compile", True):
            config = CompileConfig()
            config._compile_all_devices = True  # type: ignore[assignment]  # transformers' switch: compile off CUDA
            kwargs["compile_config"] = config
        else:
            kwargs["disable_compile"] = True
    return kwargs


class HuggingFaceMethod:
    """A peer: ``model.generate`` greedy decoding with the peer's arguments (see :data:`PEERS`).

    Called as ``model.generate(ids, attention_mask=ones, do_sample=False,
    max_new_tokens=M, **arguments)``, with the same end-of-sequence ids specdec uses, so
    both stop alike.
    """

    def __init__(self, spec: MethodSpec, model: Any, eos_token_ids: Sequence[int], meter: ForwardMeter) -> None:
        self.spec = spec
        self.peer = PEERS[spec.name]
        self._model = model
        self._meter = meter
        self._eos = list(eos_token_ids)
        self._device = next(model.parameters()).device
        self._kwargs = self.generate_kwargs()

    def generate_kwargs(self) -> dict[str, Any]:
        """The ``generate`` arguments besides the prompt and the length.

        ``hf-static`` on a CUDA device is what ``generate(cache_implementation="static")``
        does by itself: it compiles the one-token forward (inductor, ``reduce-overhead``:
        CUDA graphs) on first use. Elsewhere transformers 5.x runs a static cache
        uncompiled unless a ``CompileConfig`` flags all devices, so the same default
        config is passed with that flag: what a user who asks for static cache plus
        torch.compile gets. ``compile=false`` runs the static cache uncompiled everywhere.
        """
        kwargs = peer_arguments(self.peer, self.spec.options)
        if self._eos:
            kwargs["eos_token_id"] = self._eos
        pad = getattr(self._model.generation_config, "pad_token_id", None)
        kwargs["pad_token_id"] = pad if pad is not None else (self._eos[0] if self._eos else 0)
        return kwargs

    def generate(self, prompt: Sequence[int], max_new_tokens: int) -> Measurement:
        ids = torch.tensor([list(prompt)], dtype=torch.long, device=self._device)
        forwards, forward_s = self._meter.snapshot()
        hooks = self._meter.paused() if self.peer.compiled else contextlib.nullcontext()
        with hooks, torch.inference_mode():
            if self._device.type == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            out = self._model.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
                **self._kwargs,
            )
            if self._device.type == "cuda":
                torch.cuda.synchronize()
            wall_s = time.perf_counter() - started
        tokens = [int(t) for t in out[0, len(prompt):]]
        generated = len(tokens)
        stop_reason = "max_new_tokens"
        # Cut at the first end-of-sequence token, as specdec's stop rules do (generate crops
        # its own steps at EOS already; this keeps the two definitions of output one).
        cut = next((i + 1 for i, t in enumerate(tokens) if t in self._eos), None)
        if cut is not None:
            tokens, stop_reason = tokens[:cut], "eos"
        # Unhooked: plain decoding runs one forward per generated token (the prefill decides the first).
        hooked = not self.peer.compiled
        return Measurement(
            tokens=tokens,
            wall_s=wall_s,
            forwards=self._meter.forwards - forwards if hooked else generated,
            forward_s=self._meter.forward_s - forward_s if hooked else None,
            emitted_by_steps=max(0, generated - 1),
            stop_reason=stop_reason,
        )


def build_methods(
    specs: Sequence[MethodSpec],
    model: Any,
    tokenizer: Any,
    meter: ForwardMeter,
    *,
    tree_ops: str = "auto",
    datastores: Sequence[str | os.PathLike[str]] = (),
) -> list[Method]:
    """One method object per spec; drafter names, options and datastores are checked here, before any run.

    ``datastores`` are files whose kind (read from each header) names the drafter that gets
    it: a ``rest`` file goes to ``rest`` and to the ``rest`` part of composites.
    """
    kinds = datastore_kinds(datastores)
    takers = {part for spec in specs if not spec.is_peer for part in spec.name.split("+")}
    unused = sorted(set(kinds) - takers)
    if unused:
        raise SpecDecError(f"no method in this run reads a {unused[0]!r} datastore ({kinds[unused[0]]})")
    eos = eos_token_ids(model, tokenizer)
    methods: list[Method] = []
    for spec in specs:
        if spec.is_peer:
            methods.append(HuggingFaceMethod(spec, model, eos, meter))
            continue
        try:
            methods.append(SpecdecMethod(spec, model, tokenizer, meter, tree_ops, kinds))
        except (SpecDecError, TypeError) as error:
            peers = f" (or a peer: {', '.join(PEERS)})" if "unknown drafter" in str(error) else ""
            raise SpecDecError(f"method {spec.label!r}: {error}{peers}") from None
    return methods
