"""specdec inside Hugging Face's ``model.generate``: ``custom_generate=specdec.hf_generate(...)``.

transformers 5.x lets ``generate`` hand its decoding loop to a callable: with
``model.generate(..., custom_generate=fn)`` it prepares the inputs, the generation config,
the logits processors and the stopping criteria as usual, puts the prompt to the streamer,
and then returns ``fn(model, input_ids, logits_processor=..., stopping_criteria=...,
generation_config=..., **model_kwargs)``. :func:`hf_generate` makes such a callable
(:class:`HFGenerate`) that runs specdec's loop instead of ``generate``'s and returns what
``generate`` returns: the ``[1, prompt + new]`` tensor, or a ``GenerateDecoderOnlyOutput``
with ``sequences`` alone when ``return_dict_in_generate=True``.

**What is honoured, and how.** Everything is read from what ``generate`` prepared, so the
generation config, ``generate``'s keyword arguments and user-given processors count alike:

- the length: ``MaxLengthCriteria`` (``max_new_tokens``/``max_length``);
- the end: ``EosTokenCriteria`` (``eos_token_id``, an id or a list); ``pad_token_id`` pads
  finished rows of a batch, so one sequence never needs it;
- ``min_new_tokens``/``min_length`` (their processors): no EOS id is chosen before that many
  new tokens (:class:`~specdec.sampling.EosSuppressed`, the plain and speculative path alike);
- ``StopStringCriteria`` and ``MaxTimeCriteria``: asked after every new token, with the
  prompt, as ``generate`` asks them (scores are not given: those two do not read them);
- the choice: greedy, or sampling (``do_sample``) with ``TemperatureLogitsWarper``,
  ``TopKLogitsWarper``, ``TopPLogitsWarper`` in ``generate``'s order, and
  ``RepetitionPenaltyLogitsProcessor``. Sampling is specdec's position-keyed sampling
  (:mod:`specdec.sampling`): exact draws from the same distributions, but from specdec's
  random numbers, so the tokens equal specdec's plain sampling with the same seed, not
  ``generate``'s own multinomial draws. The seed: ``seed=`` given to :func:`hf_generate` or
  to ``model.generate``; else one drawn from torch's global generator, so that
  ``torch.manual_seed(s)`` (or ``transformers.set_seed(s)``) before the call makes it repeatable.
- ``streamer``: the prompt (put by ``generate`` itself), then every accepted token in
  order, as ``[1, n]`` tensors on the CPU (what ``generate``'s own assisted decoding puts
  for a step of ``n`` tokens), then ``end()``.
- a ``[1, L]`` prompt with left padding (``attention_mask`` zeros first): the padding is
  left out of the model's input and kept in the returned sequence, as ``generate`` keeps it.

**Assistants**: ``generate``'s ``assistant_model=M`` drafts with specdec's ``model`` drafter
(``draft_model=M``), ``assistant_early_exit=N`` with ``early-exit`` (``layers=N``), in place of
hf_generate's default drafter, or filling the part of a composite that names them (``"sam+model"``).

**Refused, with an error that names it** (never ignored): every other logits processor
(``no_repeat_ngram_size``, ``bad_words_ids``, ``min_p``, ``typical_p``, guidance, ...,
``prefix_allowed_tokens_fn``, user processors), any other stopping criterion, beam search
and every mode but greedy and sampling (``num_beams``, ``penalty_alpha``, ``dola_layers``,
constraints, ``prompt_lookup_num_tokens``, ``use_mtp``), ``num_return_sequences > 1``,
``output_scores``/``output_logits``/``output_attentions``/``output_hidden_states`` (specdec's
tree forwards give another rounding of those values than ``generate``'s one-token forwards,
so they cannot be returned as ``generate`` would compute them), ``inputs_embeds`` and other
model inputs, a filled cache to continue from, and a batch of more than one sequence
(batching is coming: issue #32).

**Two limits of transformers** (5.0 to 5.24): for a callable ``custom_generate``,
``generate`` drops its ``tokenizer=`` and then refuses ``stop_strings`` itself; pass
``stopping_criteria=[StopStringCriteria(tokenizer, [...])]`` instead, which is honoured. It
also does not pass the ``streamer`` on; :class:`HFGenerate` reads it from the ``generate``
call that called it (the frame whose ``custom_generate`` is this very object).

One :class:`~specdec.Generator` per model is made at the first call and kept, so later calls
reuse its verifier, drafter factory and what its budget planner learned. As with
:func:`specdec.run`, no generated text is shared between calls (``sam``'s store of earlier
answers is off) unless ``store=`` is given: a shared store lets response times reveal what
other calls generated.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Sequence
from typing import Any, TypedDict, cast

import torch
from transformers.generation import logits_process as lp
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria
from transformers.generation.utils import GenerateDecoderOnlyOutput
from typing_extensions import Unpack

from specdec.api import Generator
from specdec.datastores.shared_store import SharedStore
from specdec.errors import SpecDecError
from specdec.options import GENERATOR_OPTIONS
from specdec.types import Drafter, DrafterFactory, GenerationResult

# transformers' processors that change which token is chosen and that specdec does not
# implement, with the generate option that makes each one (for the error message).
_PROCESSOR_OPTIONS = {
    "NoRepeatNGramLogitsProcessor": "no_repeat_ngram_size",
    "EncoderNoRepeatNGramLogitsProcessor": "encoder_no_repeat_ngram_size",
    "EncoderRepetitionPenaltyLogitsProcessor": "encoder_repetition_penalty",
    "NoBadWordsLogitsProcessor": "bad_words_ids",
    "SequenceBiasLogitsProcessor": "sequence_bias",
    "PrefixConstrainedLogitsProcessor": "prefix_allowed_tokens_fn",
    "ForcedBOSTokenLogitsProcessor": "forced_bos_token_id",
    "ForcedEOSTokenLogitsProcessor": "forced_eos_token_id",
    "InfNanRemoveLogitsProcessor": "remove_invalid_values",
    "ExponentialDecayLengthPenalty": "exponential_decay_length_penalty",
    "SuppressTokensLogitsProcessor": "suppress_tokens",
    "SuppressTokensAtBeginLogitsProcessor": "begin_suppress_tokens",
    "UnbatchedClassifierFreeGuidanceLogitsProcessor": "guidance_scale",
    "ClassifierFreeGuidanceLogitsProcessor": "guidance_scale",
    "MinPLogitsWarper": "min_p",
    "TypicalLogitsWarper": "typical_p",
    "EpsilonLogitsWarper": "epsilon_cutoff",
    "EtaLogitsWarper": "eta_cutoff",
    "TopHLogitsWarper": "top_h",
    "WatermarkLogitsProcessor": "watermarking_config",
    "SynthIDTextWatermarkLogitsProcessor": "watermarking_config",
    "LogitNormalization": "renormalize_logits",
}
# Options of the generation config that pick another decoding mode or ask for outputs
# specdec cannot give, with their neutral values.
_REFUSED_CONFIG = {
    "num_beams": 1, "num_return_sequences": 1, "penalty_alpha": None, "dola_layers": None, "constraints": None,
    "force_words_ids": None, "prompt_lookup_num_tokens": None, "use_mtp": None,
    "output_scores": False, "output_logits": False, "output_attentions": False, "output_hidden_states": False,
}
# What generate passes as model kwargs that specdec may leave aside: it runs the model itself.
_MODEL_KWARGS_IGNORED = frozenset({"use_cache", "logits_to_keep", "cache_position"})
_CACHE_KWARGS = ("cache", "past_key_values")
# The stopping criteria that are asked after every new token (they do not read scores).
_ASKED_CRITERIA = ("StopStringCriteria", "MaxTimeCriteria")
DEFAULT_DRAFTER = "sam+recycling"  # hf_generate's; generate's assistant_model / assistant_early_exit replace it
# specdec's decoding options that the generate call decides (its config, its keywords).
_GENERATE_DECIDES = ("max_new_tokens", "min_new_tokens", "eos_token_id", "ignore_eos", "stop", "stop_when",
                     "do_sample", "temperature", "top_k", "top_p", "repetition_penalty", "use_generation_config",
                     "chat_template")


class HFOptions(TypedDict, total=False):
    """The options of :func:`hf_generate` (the :class:`~specdec.Generator`'s, and how each step drafts)."""

    drafter_options: dict[str, Any] | None
    engine: str
    datastore: str | None
    store: bool | int | SharedStore
    planner_cache: bool | None
    backend: str  # deprecated (Generator's tree_ops=)
    cache: str  # deprecated: engine=
    tokenizer: Any
    budget: str | int
    max_nodes: int | None
    prompt_feedback: bool
    seed: int | None


def _name(obj: Any) -> str:
    return type(obj).__name__


def _ids(value: Any) -> list[int]:
    """Token ids of an int, a list or a tensor (an EOS setting)."""
    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        return [int(t) for t in value.flatten().tolist()]
    if isinstance(value, int):
        return [value]
    return [int(t) for t in value]


class _Generators(weakref.WeakKeyDictionary["HFGenerate", tuple[Any, Generator]]):
    """The Generators that :class:`HFGenerate` callables made for one model, stored on the model, each with
    the assistant it drafts with (:meth:`HFGenerate.generator`; None: the callable's own drafter).

    Copying or pickling the model leaves them behind (a copy starts with none): a Generator
    belongs to the model object it was made for.
    """

    ATTRIBUTE = "_specdec_hf_generators"

    @classmethod
    def of(cls, model: Any) -> _Generators:
        slots = model.__dict__.get(cls.ATTRIBUTE)
        if not isinstance(slots, cls):
            slots = cls()
            object.__setattr__(model, cls.ATTRIBUTE, slots)  # nn.Module.__setattr__ would do the same here
        return slots

    def __deepcopy__(self, memo: dict[int, Any]) -> _Generators:
        return type(self)()

    def __copy__(self) -> _Generators:
        return type(self)()

    def __reduce__(self) -> tuple[type[_Generators], tuple[()]]:
        return type(self), ()


class HFGenerate:
    """The callable :func:`hf_generate` returns: ``model.generate(..., custom_generate=it)``.

    ``last_result``: the :class:`~specdec.types.GenerationResult` of the latest call (its
    ``stats``: MAT, steps, timings), None before the first.
    """

    def __init__(self, drafter: str | Drafter | DrafterFactory, options: HFOptions) -> None:
        decided = [name for name in _GENERATE_DECIDES if name in options]
        if decided:
            raise SpecDecError(
                f"hf_generate(): {decided[0]} is decided by the model.generate call (its keyword or generation "
                f"config), not here; pass it to model.generate"
            )
        known = set(GENERATOR_OPTIONS) - {"device", "dtype"} | {"tokenizer", "budget", "max_nodes",
                                                                "prompt_feedback", "seed"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"hf_generate() got an unexpected keyword argument {unknown[0]!r}")
        self.drafter = drafter
        self.options: dict[str, Any] = dict(options)
        self.last_result: GenerationResult | None = None
        self._lock = threading.Lock()

    def generator(self, model: Any, assistant: tuple[str, Any] | None = None) -> Generator:
        """The :class:`~specdec.Generator` for ``model``: made at its first call, then reused.

        ``assistant``: what ``generate`` was given to draft with, ``("model", assistant_model)`` or
        ``("early-exit", assistant_early_exit)`` (:func:`assisted_drafter`); a call with another
        assistant than the last one makes a new Generator.

        It is kept on the model (:class:`_Generators`), not here: a Generator holds its model, so a
        table here would keep every model this callable ever ran alive for as long as the
        callable lives. On the model, the two form a cycle that goes when the user drops the
        model; and a dropped callable's entry goes with it (weak keys).
        """
        with self._lock:
            slots = _Generators.of(model)
            found = slots.get(self)
            if found is not None and _same_assistant(found[0], assistant):
                return found[1]
            construction = {k: v for k, v in self.options.items() if k in GENERATOR_OPTIONS}
            # As specdec.run: no generated text is shared between calls unless the caller gives store=.
            construction.setdefault("store", False)
            drafter = self.drafter
            if assistant is not None:
                drafter, construction["drafter_options"] = assisted_drafter(
                    self.drafter, construction.get("drafter_options"), *assistant)
            generator = Generator(model, self.options.get("tokenizer"), drafter=drafter,
                                  budget=self.options.get("budget", "auto"), **construction)
            slots[self] = (assistant, generator)
            return generator

    def __call__(
        self,
        model: Any,
        input_ids: torch.Tensor,
        logits_processor: Sequence[Any] | None = None,
        stopping_criteria: Sequence[Any] | None = None,
        generation_config: Any = None,
        streamer: Any = None,
        seed: int | None = None,
        **model_kwargs: Any,
    ) -> Any:
        caller = _generate_frame(self)
        if streamer is None and caller is not None:
            streamer = caller.get("streamer")
        try:
            return self._generate(model, input_ids, list(logits_processor or ()), list(stopping_criteria or ()),
                                  generation_config, streamer, seed, caller or {}, model_kwargs)
        finally:
            if streamer is not None:  # as generate does; also on an error, so a reading thread is not left waiting
                streamer.end()

    def _generate(
        self,
        model: Any,
        input_ids: torch.Tensor,
        processors: list[Any],
        criteria: list[Any],
        config: Any,
        streamer: Any,
        seed: int | None,
        caller: dict[str, Any],
        model_kwargs: dict[str, Any],
    ) -> Any:
        if config is None:
            raise SpecDecError("hf_generate() is called by model.generate(..., custom_generate=...), "
                               "which passes a generation config")
        assistant = _assistant(config, caller.get("assistant_model"))
        _check_mode(config, assisted=assistant is not None)
        if input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise SpecDecError(
                f"input_ids of shape {tuple(input_ids.shape)}: specdec's custom_generate decodes one sequence "
                "([1, L]) at a time; batches are coming (issue #32)"
            )
        _check_model_kwargs(model_kwargs)
        padding = _left_padding(model_kwargs.get("attention_mask"), input_ids.shape[1])
        _check_positions(model_kwargs.get("position_ids"), padding, input_ids.shape[1])
        total = int(input_ids.shape[1])
        prompt = [int(t) for t in input_ids[0, padding:].tolist()]
        options: dict[str, Any] = {k: self.options[k] for k in ("budget", "max_nodes", "prompt_feedback")
                                   if k in self.options}
        options.update(_stop_options(criteria, [int(t) for t in input_ids[0].tolist()]))
        options.update(_choice_options(processors, config, options.get("eos_token_id") or [], total, padding))
        if options.get("do_sample"):
            chosen = seed if seed is not None else self.options.get("seed")
            options["seed"] = chosen if chosen is not None else int(torch.randint(0, 2**62, (1,)).item())
        elif seed is not None:
            raise SpecDecError(f"seed={seed!r} has no effect without do_sample=True")
        if not options.get("eos_token_id"):
            options.pop("eos_token_id", None)
            options["ignore_eos"] = True

        def on_tokens(tokens: list[int]) -> None:
            streamer.put(torch.tensor([tokens], dtype=torch.long))

        result = self.generator(model, assistant).generate(
            prompt, on_tokens=on_tokens if streamer is not None else None, **options
        )
        self.last_result = result
        new = torch.tensor([result.tokens], dtype=input_ids.dtype, device=input_ids.device)
        sequences = torch.cat([input_ids, new], dim=1)
        if getattr(config, "return_dict_in_generate", False):
            return GenerateDecoderOnlyOutput(sequences=cast(Any, sequences))
        return sequences


def _generate_frame(hook: HFGenerate) -> dict[str, Any] | None:
    """The locals of the ``generate`` call that called ``hook``, or None when it was called otherwise.

    transformers (5.0-5.24) does not pass ``streamer`` and ``assistant_model`` on to a
    callable ``custom_generate``; they are the arguments of the ``generate`` frame whose
    ``custom_generate`` is this very object, two frames up (``__call__`` is one).
    """
    frame = sys._getframe(2)
    try:
        if frame.f_code.co_name == "generate" and frame.f_locals.get("custom_generate") is hook:
            return {name: frame.f_locals.get(name) for name in ("streamer", "assistant_model")}
        return None
    finally:
        del frame


def _assistant(config: Any, assistant_model: Any) -> tuple[str, Any] | None:
    """What ``generate`` was given to draft with: ``("model", assistant_model)``, ``("early-exit", layers)``
    (``assistant_early_exit``), or None."""
    layers = getattr(config, "assistant_early_exit", None)
    if assistant_model is not None and layers is not None:
        raise SpecDecError("give generate assistant_model or assistant_early_exit, not both")
    if assistant_model is not None:
        return ("model", assistant_model)
    return None if layers is None else ("early-exit", layers)


def _same_assistant(old: tuple[str, Any] | None, new: tuple[str, Any] | None) -> bool:
    if old is None or new is None:
        return old is new
    return old[0] == new[0] and (old[1] is new[1] if old[0] == "model" else old[1] == new[1])


def assisted_drafter(
    drafter: str | Drafter | DrafterFactory, options: Any, kind: str, value: Any
) -> tuple[str, dict[str, Any]]:
    """``(drafter, drafter_options)`` for ``generate``'s assistant: ``kind`` ``"model"`` (``value``: the
    assistant model, the ``model`` drafter's ``draft_model``) or ``"early-exit"`` (``value``: its ``layers``).

    hf_generate's own drafter stays where it names ``kind`` as itself or as a composite's part (``"sam+model"``:
    the assistant fills that part's option); its default gives way to ``kind`` alone; any other is a conflict.
    """
    option = "draft_model" if kind == "model" else "layers"
    name = drafter if isinstance(drafter, str) else ""
    parts = name.strip().lower().split("+")
    own = dict(options or {})
    if parts == [kind]:
        return kind, {**own, option: value}
    if len(parts) == 2 and kind in parts:
        return name, {**own, f"{kind}.{option}": value}
    if drafter == DEFAULT_DRAFTER:
        return kind, {option: value}
    raise SpecDecError(
        f"generate's {'assistant_model' if kind == 'model' else 'assistant_early_exit'} drafts with drafter "
        f"{kind!r}, and hf_generate was given drafter {name or type(drafter).__name__!r}: give one of them "
        f"(or a composite such as 'sam+{kind}')"
    )


def _check_mode(config: Any, assisted: bool = False) -> None:
    """Refuse every decoding mode but greedy and sampling, and outputs specdec cannot give.

    ``assisted``: generate was given an assistant (:func:`_assistant`), which specdec drafts with; the
    config then names assisted generation, and greedy or sampling is what ``do_sample`` says."""
    for name, neutral in _REFUSED_CONFIG.items():
        value = getattr(config, name, neutral)
        if value is not None and value != neutral:
            if name == "num_return_sequences":
                raise SpecDecError(f"num_return_sequences={value!r}: specdec's custom_generate returns one sequence "
                                   "(batches are coming: issue #32)")
            raise SpecDecError(f"{name}={value!r} is not supported by specdec's custom_generate (it decodes greedily "
                               "or samples, and returns sequences only); drop it, or call generate without it")
    mode = getattr(config.get_generation_mode(), "value", "")
    if mode not in ("greedy_search", "sample") and not (assisted and mode == "assisted_generation"):
        raise SpecDecError(f"generation mode {mode!r} is not supported by specdec's custom_generate "
                           "(greedy decoding and sampling are)")


def _left_padding(mask: Any, length: int) -> int:
    """How many padding tokens lead the one sequence (``attention_mask`` zeros first; None: no padding)."""
    if mask is None:
        return 0
    row = [int(v) for v in mask.reshape(-1).tolist()]
    if mask.dim() != 2 or len(row) != length:
        raise SpecDecError(f"attention_mask of shape {tuple(mask.shape)} does not match input_ids [1, {length}]")
    padding = next((i for i, v in enumerate(row) if v != 0), length)
    if padding == length or any(v != 1 for v in row[padding:]):
        raise SpecDecError("attention_mask: specdec's custom_generate takes left padding only (zeros, then ones)")
    return padding


def _check_model_kwargs(kwargs: dict[str, Any]) -> None:
    """Refuse model inputs specdec would not pass to the model (it runs the model on the token ids alone)."""
    for name, value in kwargs.items():
        if name in _MODEL_KWARGS_IGNORED or name in ("attention_mask", "position_ids") or value is None:
            continue
        if name in _CACHE_KWARGS:
            filled = getattr(value, "get_seq_length", lambda: 0)()
            if filled:
                raise SpecDecError(f"{name} holds {filled} tokens: specdec's custom_generate starts from an "
                                   "empty cache (it keeps its own); pass the whole sequence as input_ids")
            continue
        raise SpecDecError(f"model input {name!r} is not supported by specdec's custom_generate: it runs the model "
                           "on input_ids alone")


def _check_positions(position_ids: Any, padding: int, length: int) -> None:
    """Positions must be ``generate``'s own: 0, 1, 2, ... from the first token after the padding."""
    if position_ids is None:
        return
    expected = torch.arange(length - padding, device=position_ids.device)
    if position_ids.shape[-1] != length or not torch.equal(position_ids.reshape(-1)[padding:], expected):
        raise SpecDecError("position_ids other than 0, 1, 2, ... after the padding are not supported "
                           "by specdec's custom_generate")


def _stop_options(criteria: list[Any], sequence: list[int]) -> dict[str, Any]:
    """``max_new_tokens``, ``eos_token_id`` and ``stop_when`` from ``generate``'s stopping criteria.

    ``sequence``: the input ids as ``generate`` holds them (padding included), which its
    criteria measure and read.
    """
    max_lengths = [c.max_length for c in criteria if type(c) is MaxLengthCriteria]
    eos = sorted({t for c in criteria if type(c) is EosTokenCriteria for t in _ids(c.eos_token_id)})
    asked = [c for c in criteria if _name(c) in _ASKED_CRITERIA]
    for c in criteria:
        if type(c) not in (MaxLengthCriteria, EosTokenCriteria) and _name(c) not in _ASKED_CRITERIA:
            raise SpecDecError(
                f"stopping criterion {_name(c)} is not supported by specdec's custom_generate (it may read scores, "
                "which specdec does not compute as generate does); supported: max_length/max_new_tokens, "
                "eos_token_id, StopStringCriteria, max_time"
            )
    if not max_lengths:
        raise SpecDecError("generate passed no MaxLengthCriteria: set max_new_tokens")
    max_new = min(max_lengths) - len(sequence)
    if max_new < 1:
        raise SpecDecError(f"max_length={min(max_lengths)} leaves no room after the {len(sequence)} input tokens")
    options: dict[str, Any] = {"max_new_tokens": max_new, "eos_token_id": eos}
    if asked:

        def stop_when(new: Sequence[int]) -> bool:
            ids = torch.tensor([sequence + list(new)], dtype=torch.long)  # what generate would hold by now
            return any(bool(c(ids, None).any()) for c in asked)

        options["stop_when"] = stop_when
    return options


def _choice_options(processors: list[Any], config: Any, eos: list[int], total: int, padding: int) -> dict[str, Any]:
    """The sampling options and ``min_new_tokens`` of ``generate``'s logits processors; any other one is refused."""
    options: dict[str, Any] = {"do_sample": bool(getattr(config, "do_sample", False))}
    min_new = 0
    warpers: list[str] = []
    for p in processors:
        kind = type(p)
        if kind is lp.RepetitionPenaltyLogitsProcessor:
            ignored = p.prompt_ignore_length
            ignored = 0 if ignored is None else int(torch.as_tensor(ignored).reshape(-1)[0])
            if ignored != padding:  # transformers < 5.23 penalizes a left-padded prompt's padding tokens too
                raise SpecDecError(
                    f"repetition_penalty over {padding} padding tokens, {ignored} of them left out of the penalty: "
                    "specdec's custom_generate leaves out exactly the padding (as transformers >= 5.23 does); "
                    "pass the prompt without padding, or a RepetitionPenaltyLogitsProcessor with "
                    "prompt_ignore_length set to the padding"
                )
            options["repetition_penalty"] = float(p.penalty)
        elif kind in (lp.MinLengthLogitsProcessor, lp.MinNewTokensLengthLogitsProcessor):
            if sorted(set(_ids(p.eos_token_id))) != eos:
                raise SpecDecError(f"{_name(p)} suppresses other EOS ids ({_ids(p.eos_token_id)}) than "
                                   f"generation stops at ({eos}); specdec's custom_generate needs them equal")
            if kind is lp.MinLengthLogitsProcessor:
                min_new = max(min_new, int(p.min_length) - total)
            else:
                min_new = max(min_new, int(p.min_new_tokens) - (total - int(p.prompt_length_to_skip)))
        elif kind in (lp.TemperatureLogitsWarper, lp.TopKLogitsWarper, lp.TopPLogitsWarper):
            if getattr(p, "filter_value", -float("inf")) != -float("inf") or getattr(p, "min_tokens_to_keep", 1) > 1:
                raise SpecDecError(f"{_name(p)} with a filter value or min_tokens_to_keep of its own is not "
                                   "supported by specdec's custom_generate")
            warpers.append(kind.__name__)
            if kind is lp.TemperatureLogitsWarper:
                options["temperature"] = float(p.temperature)
            elif kind is lp.TopKLogitsWarper:
                options["top_k"] = int(p.top_k)
            else:
                options["top_p"] = float(p.top_p)
        else:
            option = _PROCESSOR_OPTIONS.get(_name(p), f"logits_processor=[{_name(p)}(...)]")
            raise SpecDecError(f"{option} ({_name(p)}) changes which token is chosen, and specdec's custom_generate "
                               "does not implement it; drop it, or call generate without custom_generate")
    order = ["TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper"]
    if warpers != sorted(warpers, key=order.index) or len(set(warpers)) != len(warpers):
        raise SpecDecError(f"logits warpers in the order {warpers}: specdec applies temperature, then top-k, "
                           "then top-p, as generate builds them")
    if not options["do_sample"]:  # greedy: the warpers keep the argmax where it is
        for name in ("temperature", "top_k", "top_p"):
            options.pop(name, None)
    if min_new > 0:
        options["min_new_tokens"] = min_new
    return options


def hf_generate(drafter: str | Drafter | DrafterFactory = DEFAULT_DRAFTER, **options: Unpack[HFOptions]) -> HFGenerate:
    """A ``custom_generate`` for Hugging Face's ``model.generate`` that decodes with specdec.

    >>> out = model.generate(input_ids, attention_mask=mask, max_new_tokens=128,
    ...                      custom_generate=specdec.hf_generate(drafter="sam+recycling"))  # doctest: +SKIP

    ``drafter`` and ``options`` are :func:`specdec.run`'s: ``drafter_options``, ``engine``,
    ``datastore``, ``store``, ``planner_cache``, ``tokenizer`` (for drafters that read text),
    ``budget``, ``max_nodes``, ``prompt_feedback``, and ``seed`` (for sampling; also accepted by
    ``model.generate(..., seed=)``); the former ``backend`` and ``cache`` still work, with a
    :class:`DeprecationWarning` (docs/usage.md). What ``generate`` decides (its length, EOS,
    sampling and penalty settings) is taken from its call; the module docstring lists what is
    honoured and what is refused. Keep the returned object to reuse its
    :class:`~specdec.Generator` across calls.
    """
    return HFGenerate(drafter, options)
