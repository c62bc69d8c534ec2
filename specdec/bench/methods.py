"""The methods a benchmark compares: specdec drafters and Hugging Face's own decoding.

A method is named by a **spec** string: ``[label=]name[:key=value[:key=value...]]``.

- ``name`` is a registered drafter (``specdec.available_drafters()``: ``none``, ``pld``,
  ...) run through specdec's loop, or one of the peers run through ``model.generate``:
  ``hf-generate`` (plain greedy decoding) and ``hf-pld`` (Hugging Face's prompt lookup,
  ``prompt_lookup_num_tokens=10`` unless ``num_tokens`` says otherwise).
- ``key=value`` pairs are the drafter's options; values parse as JSON when they can
  (``pld:num_draft=6``), else stay strings (``rest:datastore=gsm8k.rest``). ``budget``
  and ``max_nodes`` go to ``generate`` instead (``sam:budget=full``), and so do the
  sampling options ``do_sample``, ``temperature``, ``top_k``, ``top_p`` and ``seed``
  (``pld:temperature=0.7:seed=7``): a sampled method's output is judged against ``none``
  with the same sampling options, which must be among the methods.
- ``label`` names the method in tables (default: the spec itself), so one drafter can
  appear twice with two settings: ``pld6=pld:num_draft=6``.

Every method is measured the same way, by hooks on the target model's ``forward``
(:class:`ForwardMeter`): the number of target forwards and the time spent inside them.
So MAT means the same thing for a peer as for specdec (tokens emitted per target forward
after the prefill, bonus included), and ``wall - forward time`` is each method's own host
overhead: the loop, drafting, mask building, acceptance and cache bookkeeping.
"""

from __future__ import annotations

import inspect
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from specdec.errors import SpecDecError

HF_GENERATE = "hf-generate"
HF_PLD = "hf-pld"
PEERS = (HF_GENERATE, HF_PLD)
# Greedy baselines: their output is plain decoding by definition, so identity is judged against them.
GREEDY_BASELINES = ("none", HF_GENERATE)
# Options the peers take, with Hugging Face's argument each one sets.
_PEER_OPTIONS: dict[str, dict[str, str]] = {
    HF_GENERATE: {},
    HF_PLD: {"num_tokens": "prompt_lookup_num_tokens", "max_ngram": "max_matching_ngram_size"},
}
# Spec options that go to ``Generator.generate`` (how the loop runs the drafter), not to the drafter.
SAMPLING_OPTIONS = ("do_sample", "temperature", "top_k", "top_p", "seed")
GENERATION_OPTIONS = ("budget", "max_nodes", *SAMPLING_OPTIONS)
_PEER_DEFAULTS: dict[str, dict[str, Any]] = {HF_GENERATE: {}, HF_PLD: {"prompt_lookup_num_tokens": 10}}


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
        unknown = sorted(set(options) - set(_PEER_OPTIONS[name]))
        if unknown:
            valid = ", ".join(_PEER_OPTIONS[name]) or "none"
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
    (specdec's verifier, ``model.generate``) runs through ``__call__``. On a GPU the hooks
    synchronize, so the time is the kernels' and not the launch's; that sync is a cost
    every method pays alike. Hooks add ~2 us per forward.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.forwards = 0
        self.forward_s = 0.0
        self._started = 0.0
        self._cuda = next(model.parameters()).device.type == "cuda"
        self._handles = [
            model.register_forward_pre_hook(self._before),
            model.register_forward_hook(self._after),
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
    time inside those forwards. ``draft_s``/``verify_s``/``prefill_s``/``other_s`` come
    from specdec's own stats and are None for the peers.

    ``calibration_s`` and ``extra_forwards``: a one-time measurement of the verifier's
    cost (the draft budget planner's calibration, on its first draft in a process) runs
    forwards that are not decoding. They are taken out of ``wall_s``, ``forward_s`` and
    ``forwards`` and recorded apart; the runner's warm-up normally absorbs them.
    """

    tokens: list[int]
    wall_s: float
    forwards: int
    forward_s: float
    emitted_by_steps: int
    stop_reason: str
    calibration_s: float = 0.0
    extra_forwards: int = 0
    tree_nodes: int | None = None  # nodes verified over all steps (specdec's stats)
    prefill_s: float | None = None
    draft_s: float | None = None
    verify_s: float | None = None
    other_s: float | None = None

    @property
    def new_tokens(self) -> int:
        return len(self.tokens)

    @property
    def steps(self) -> int:
        return max(0, self.forwards - 1)


class Method(Protocol):
    spec: MethodSpec

    def generate(self, prompt: Sequence[int], max_new_tokens: int) -> Measurement: ...


class SpecdecMethod:
    """A registered drafter through specdec's loop (a fresh drafter per generation)."""

    def __init__(self, spec: MethodSpec, model: Any, tokenizer: Any, meter: ForwardMeter, backend: str,
                 datastores: Mapping[str, str] | None = None) -> None:
        from specdec.api import Generator

        self.spec = spec
        self._meter = meter
        options = {k: v for k, v in spec.options.items() if k not in GENERATION_OPTIONS}
        self._generation = {k: v for k, v in spec.options.items() if k in GENERATION_OPTIONS}
        accepted = inspect.signature(Generator.generate).parameters
        for key in self._generation:
            if key not in accepted:
                raise SpecDecError(f"method {spec.label!r}: this specdec's generate() takes no {key!r}")
        options = with_datastores(spec.name, options, datastores or {})
        self._generator = Generator(model, tokenizer, drafter=spec.name, drafter_options=options, backend=backend)

    def prepare(self) -> None:
        """Pay one-time costs now (the budget planner's calibration, on its first use in a process).

        Every budget needs it: the calibration also picks the verifier's kernels.
        """
        from specdec.budget.cost import cost_model

        cost_model(self._generator.verifier)

    def generate(self, prompt: Sequence[int], max_new_tokens: int) -> Measurement:
        forwards, forward_s = self._meter.snapshot()
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
        )


def drafter_context(model: Any, tokenizer: Any) -> Any:
    """What drafter factories may know of the target, as :class:`~specdec.api.Generator` builds it."""
    from specdec.drafters import DrafterContext
    from specdec.models import eos_token_ids

    vocab = int(model.get_output_embeddings().weight.shape[0])
    return DrafterContext(vocab_size=vocab, tokenizer=tokenizer, eos_token_ids=eos_token_ids(model, tokenizer))


def datastore_kinds(paths: Sequence[str | os.PathLike[str]]) -> dict[str, str]:
    """``{kind: path}`` from the datastore files' own headers (``rest``, ``sam``, ...).

    A datastore's kind is the name of the drafter that reads it, so ``--datastore`` needs
    no ``drafter=`` prefix. Two files of one kind are an error: which would go where?
    """
    from specdec.datastores.format import read_header

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


class HuggingFaceMethod:
    """``model.generate`` greedy decoding, optionally with Hugging Face's prompt lookup.

    Called as ``model.generate(ids, attention_mask=ones, do_sample=False,
    max_new_tokens=M)`` (plus ``prompt_lookup_num_tokens`` for ``hf-pld``), with the same
    end-of-sequence ids specdec uses, so both stop alike.
    """

    def __init__(self, spec: MethodSpec, model: Any, eos_token_ids: Sequence[int], meter: ForwardMeter) -> None:
        self.spec = spec
        self._model = model
        self._meter = meter
        self._eos = list(eos_token_ids)
        kwargs = dict(_PEER_DEFAULTS[spec.name])
        for key, value in spec.options.items():
            kwargs[_PEER_OPTIONS[spec.name][key]] = value
        if self._eos:
            kwargs["eos_token_id"] = self._eos
        pad = getattr(model.generation_config, "pad_token_id", None)
        kwargs["pad_token_id"] = pad if pad is not None else (self._eos[0] if self._eos else 0)
        self._kwargs = kwargs
        self._device = next(model.parameters()).device

    def generate(self, prompt: Sequence[int], max_new_tokens: int) -> Measurement:
        ids = torch.tensor([list(prompt)], dtype=torch.long, device=self._device)
        forwards, forward_s = self._meter.snapshot()
        started = time.perf_counter()
        with torch.inference_mode():
            out = self._model.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
                **self._kwargs,
            )
        wall_s = time.perf_counter() - started
        tokens = [int(t) for t in out[0, len(prompt):]]
        generated = len(tokens)
        stop_reason = "max_new_tokens"
        # Cut at the first end-of-sequence token, as specdec's stop rules do (generate crops
        # its own steps at EOS already; this keeps the two definitions of output one).
        cut = next((i + 1 for i, t in enumerate(tokens) if t in self._eos), None)
        if cut is not None:
            tokens, stop_reason = tokens[:cut], "eos"
        return Measurement(
            tokens=tokens,
            wall_s=wall_s,
            forwards=self._meter.forwards - forwards,
            forward_s=self._meter.forward_s - forward_s,
            emitted_by_steps=max(0, generated - 1),
            stop_reason=stop_reason,
        )


def build_methods(
    specs: Sequence[MethodSpec],
    model: Any,
    tokenizer: Any,
    meter: ForwardMeter,
    *,
    backend: str = "auto",
    datastores: Sequence[str | os.PathLike[str]] = (),
) -> list[Method]:
    """One method object per spec; drafter names, options and datastores are checked here, before any run.

    ``datastores`` are files whose kind (read from each header) names the drafter that gets
    it: a ``rest`` file goes to ``rest`` and to the ``rest`` part of composites.
    """
    from specdec.models import eos_token_ids

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
            methods.append(SpecdecMethod(spec, model, tokenizer, meter, backend, kinds))
        except SpecDecError as error:
            peers = f" (or a peer: {', '.join(PEERS)})" if "unknown drafter" in str(error) else ""
            raise SpecDecError(f"method {spec.label!r}: {error}{peers}") from None
    return methods
