"""One decoding config value: what one generation is asked for, validated once.

The options of :func:`specdec.run`, :func:`specdec.generate` and :meth:`specdec.Generator.generate`
are typed once, as :class:`DecodingOptions` (a ``TypedDict``: the keyword arguments). A call
builds one frozen :class:`DecodingConfig` from them (:meth:`DecodingConfig.build`): every
option is checked there (types and ranges; an error names the bad value) and what the model
decides is resolved there (its end-of-sequence ids, its generation config's sampling
defaults, the tokenizer that reads stop strings). The value then goes whole to
:func:`specdec.engine.decode`.

:class:`StopRules` say when a generation ends: the first EOS, the first token that completes
a stop string, the first token after which a ``stop_when`` check holds, or ``max_new_tokens``,
whichever comes first. ``min_new_tokens`` keeps the EOS ids from being chosen before that many
new tokens (:class:`~specdec.sampling.EosSuppressed`, on the plain and speculative path alike).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from specdec.budget.planner import Budget
from specdec.errors import SpecDecError
from specdec.sampling import Decision, EosSuppressed, Greedy, resolve_decision
from specdec.types import TokenChooser

DEFAULT_MAX_NEW_TOKENS = 256
SAMPLING_OPTIONS = ("do_sample", "temperature", "top_k", "top_p", "seed", "repetition_penalty",
                    "use_generation_config")


class DecodingOptions(TypedDict, total=False):
    """The decoding options of one generation, as keyword arguments (:func:`specdec.run` documents each)."""

    max_new_tokens: int
    min_new_tokens: int
    chat_template: bool | None
    stop: str | Sequence[str] | None
    stop_when: Callable[[Sequence[int]], bool] | None
    eos_token_id: int | Sequence[int] | None
    ignore_eos: bool
    max_nodes: int | None
    budget: str | int | None
    prompt_feedback: bool
    do_sample: bool | None
    temperature: float | None
    top_k: int | None
    top_p: float | None
    seed: int | None
    repetition_penalty: float | None
    use_generation_config: bool


DECODING_OPTIONS = frozenset(DecodingOptions.__optional_keys__)


@dataclass(frozen=True)
class StopRules:
    """When generation ends. ``decode`` (token ids -> text) is needed only for stop strings.

    ``stop_when``: called with the new tokens so far after each new token; True ends the
    generation after that token (e.g. Hugging Face stopping criteria, :mod:`specdec.hf`).
    """

    max_new_tokens: int
    eos_token_ids: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()
    decode: Callable[[list[int]], str] | None = field(default=None, compare=False)
    stop_when: Callable[[Sequence[int]], bool] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int):
            raise SpecDecError(f"max_new_tokens must be an int, got {self.max_new_tokens!r}")
        if self.max_new_tokens < 1:
            raise SpecDecError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if any(not isinstance(s, str) or not s for s in self.stop_strings):
            raise SpecDecError(f"stop strings must be non-empty strings, got {list(self.stop_strings)!r}")
        if self.stop_strings and self.decode is None:
            raise SpecDecError("stop strings need a tokenizer to decode the output")
        if self.stop_when is not None and not callable(self.stop_when):
            raise SpecDecError(f"stop_when must be a function of the new token ids, got {self.stop_when!r}")

    def cut(self, output: list[int], start: int) -> tuple[int, str] | None:
        """Where to end ``output`` given that ``output[start:]`` was just emitted.

        Returns ``(length, reason)`` for the earliest stop at or after ``start``, or None.
        A stop string stops at the first token whose text completes it (that token is kept);
        so does ``stop_when``, asked once per new token.
        """
        best: tuple[int, str] | None = None
        for i in range(start, len(output)):
            if output[i] in self.eos_token_ids:
                best = (i + 1, "eos")
                break
        if len(output) >= self.max_new_tokens and (best is None or self.max_new_tokens < best[0]):
            best = (self.max_new_tokens, "max_new_tokens")
        if self.stop_strings and self.decode is not None:
            limit = best[0] if best else len(output)
            if any(s in self.decode(output[:limit]) for s in self.stop_strings):
                for i in range(start, limit):
                    if any(s in self.decode(output[: i + 1]) for s in self.stop_strings):
                        best = (i + 1, "stop_string")
                        break
        if self.stop_when is not None:
            for i in range(start, best[0] if best else len(output)):
                if self.stop_when(output[: i + 1]):
                    if best is None or i + 1 < best[0]:
                        best = (i + 1, "stop_when")
                    break
        return best


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _optional_bool(name: str, value: Any) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise SpecDecError(f"{name} must be True, False or None, got {value!r}")
    return value


def _stop_strings(value: Any) -> tuple[str, ...]:
    stops = (value,) if isinstance(value, str) else value
    if stops is None:
        return ()
    if not isinstance(stops, Sequence):
        raise SpecDecError(f"stop must be a string or a list of strings, got {value!r}")
    return tuple(stops)  # each checked by StopRules


def _eos_ids(value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    ids = (value,) if _is_int(value) else value
    if not isinstance(ids, Sequence) or not all(_is_int(t) and t >= 0 for t in ids):
        raise SpecDecError(f"eos_token_id must be a token id or a list of token ids (ints >= 0), got {value!r}")
    return tuple(int(t) for t in ids)


def _min_new_tokens(value: Any) -> int:
    if not _is_int(value) or value < 0:
        raise SpecDecError(f"min_new_tokens must be an int >= 0, got {value!r}")
    return int(value)


def _max_nodes(value: Any) -> int | None:
    if value is not None and (not _is_int(value) or value < 1):
        raise SpecDecError(f"max_nodes must be a positive int (or None: the drafter decides), got {value!r}")
    return None if value is None else int(value)


@dataclass(frozen=True)
class DecodingConfig:
    """Everything one generation is asked for, checked and resolved (module docstring).

    ``rules``: when it ends (``max_new_tokens``, end-of-sequence ids, stop strings);
    ``decision``: how the model's tokens are chosen (greedy, or sampling with a seed; the
    repetition penalty); ``budget``: how many draft nodes each step verifies; ``max_nodes``:
    a cap on every draft tree (None: the drafter's own); ``prompt_feedback``: hand learning
    drafters the model's predictions over the prompt too; ``chat_template``: whether a text
    prompt gets the tokenizer's chat template (None: when it has one); ``min_new_tokens``: no
    EOS id of ``rules`` is chosen before this many new tokens (:meth:`chooser`).
    """

    rules: StopRules
    decision: Decision = field(default_factory=lambda: Decision(Greedy()))
    budget: Budget = field(default_factory=lambda: Budget("auto"))
    max_nodes: int | None = None
    prompt_feedback: bool = False
    chat_template: bool | None = None
    min_new_tokens: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.rules, StopRules):
            raise SpecDecError(f"a decoding config needs StopRules, got {self.rules!r}")
        _max_nodes(self.max_nodes)
        if not isinstance(self.prompt_feedback, bool):
            raise SpecDecError(f"prompt_feedback must be True or False, got {self.prompt_feedback!r}")
        _optional_bool("chat_template", self.chat_template)
        _min_new_tokens(self.min_new_tokens)

    @property
    def max_new_tokens(self) -> int:
        return self.rules.max_new_tokens

    def chooser(self, prompt_length: int) -> TokenChooser:
        """The token chooser of a sequence whose prompt has ``prompt_length`` tokens.

        The decision's own, or, with ``min_new_tokens``, one that cannot choose an EOS id at
        the positions of the first ``min_new_tokens`` new tokens (``generate``'s
        ``min_new_tokens``: the EOS logits set to -inf before the choice).
        """
        if self.min_new_tokens == 0 or not self.rules.eos_token_ids:
            return self.decision.chooser
        return EosSuppressed(self.decision.chooser, sorted(self.rules.eos_token_ids),
                             prompt_length + self.min_new_tokens)

    @classmethod
    def build(
        cls,
        options: Mapping[str, Any],
        *,
        generation_config: Any = None,
        eos_token_ids: Sequence[int] = (),
        decode_text: Callable[[list[int]], str] | None = None,
        budget: Budget | str | int = "auto",
        vocab_size: int | None = None,
    ) -> DecodingConfig:
        """The config of ``options`` (:class:`DecodingOptions`), each checked; a bad one raises naming it.

        What the model decides comes in here: ``generation_config`` (sampling defaults, with
        ``use_generation_config``), ``eos_token_ids`` (the model's, unless ``eos_token_id``
        or ``ignore_eos`` say otherwise), ``decode_text`` (the tokenizer's, for stop
        strings), ``budget`` (the default when ``budget`` is not given), ``vocab_size`` (an
        ``eos_token_id`` past it, which the model can never emit and so would silently never end
        a run, is refused; None: not checked). An unknown option is a ``TypeError``, as an
        unexpected keyword argument is.
        """
        unknown = sorted(set(options) - DECODING_OPTIONS)
        if unknown:
            known = ", ".join(sorted(DECODING_OPTIONS))
            raise TypeError(f"unexpected decoding option {unknown[0]!r}; options: {known}")
        ignore_eos = options.get("ignore_eos", False)
        if not isinstance(ignore_eos, bool):
            raise SpecDecError(f"ignore_eos must be True or False, got {ignore_eos!r}")
        eos = _eos_ids(options.get("eos_token_id"))
        if ignore_eos:
            eos = ()
        rules = StopRules(
            options.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS),
            frozenset(eos_token_ids if eos is None else eos),
            _stop_strings(options.get("stop")),
            decode_text,
            options.get("stop_when"),
        )
        sampling = {name: options[name] for name in SAMPLING_OPTIONS if name in options}
        use_generation_config = sampling.pop("use_generation_config", False)
        if not isinstance(use_generation_config, bool):
            raise SpecDecError(f"use_generation_config must be True or False, got {use_generation_config!r}")
        given_budget = options.get("budget")
        step_budget = Budget.parse(budget if given_budget is None else given_budget)
        max_nodes = _max_nodes(options.get("max_nodes"))
        if step_budget.nodes is not None:  # a fixed budget is a node cap
            max_nodes = step_budget.nodes if max_nodes is None else min(max_nodes, step_budget.nodes)
        config = cls(
            rules=rules,
            decision=resolve_decision(generation_config, use_generation_config=use_generation_config, **sampling),
            budget=step_budget,
            max_nodes=max_nodes,
            prompt_feedback=options.get("prompt_feedback", False),
            chat_template=options.get("chat_template"),
            min_new_tokens=_min_new_tokens(options.get("min_new_tokens", 0)),
        )
        outside = sorted(t for t in rules.eos_token_ids if vocab_size is not None and t >= vocab_size)
        if outside and options.get("eos_token_id") is not None:
            raise SpecDecError(f"eos_token_id {outside[0]} is outside the model's vocabulary [0, {vocab_size})")
        return config
