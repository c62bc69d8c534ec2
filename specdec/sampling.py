"""How the model's own token is chosen at a verified node: greedy, or position-keyed sampling.

The rule that makes speculation lossless: the token chosen at absolute position ``p``
depends only on the (processed) logits there and on ``p`` itself, never on how ``p`` was
reached. Then a one-node step and a tree step that both reach ``p`` with the same context
choose the same token, and speculative output equals plain output token for token.

**Greedy** takes the argmax, ties to the lowest token id (``torch.argmax`` returns the
first maximal index).

**Sampling** processes the logits as ``model.generate`` does (temperature, then top-k,
then top-p), and draws by inverse CDF with one uniform number per position::

    u(seed, p)   = splitmix64(seed, p) / 2**64           # in [0, 1), a pure function of (seed, p)
    probs        = softmax(processed logits)              # over the vocabulary, in token-id order
    token        = min { v : probs[0] + ... + probs[v] > u * sum(probs) }

Why this is an exact draw: ``u`` is uniform on [0, 1) for a fixed seed over positions
(splitmix64 is a bijective mixer of a 64-bit counter, the generator behind Java's
``SplittableRandom``), and for a uniform ``u`` the inverse CDF picks token ``v`` with
probability exactly ``probs[v]`` (a token of probability 0 owns an empty interval and is
never chosen). Different positions get independent-looking uniforms because the mixer
decorrelates neighbouring counters. A speculative step evaluates the same function at
the same positions, so it emits the very tokens plain sampling emits with that seed.

**Repetition penalty** (as ``generate``'s ``repetition_penalty``) divides positive and
multiplies negative logits of every token already in the context; a tree node's context
is the committed tokens plus the tokens on its own path, so the penalty is applied per
node from the ancestor matrix (:func:`penalty_mask`). It applies to greedy and sampling.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch

from specdec.errors import SpecDecError
from specdec.types import TokenChooser

_MASK64 = (1 << 64) - 1


def splitmix64(value: int) -> int:
    """One step of the splitmix64 mixer (a bijection of 64-bit integers)."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def position_uniform(seed: int, position: int) -> float:
    """The uniform number in [0, 1) that decides the token at ``position`` under ``seed``.

    53 random bits, so every float64 in the result is exactly representable.
    """
    return (splitmix64((splitmix64(seed & _MASK64) ^ position) & _MASK64) >> 11) * 2.0**-53


class Greedy:
    """Argmax at every node; ties resolve to the lowest token id."""

    name = "greedy"

    def choose(self, logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``logits`` float ``[N, V]``, ``positions`` int64 ``[N]`` -> int64 ``[N]``."""
        del positions  # greedy choices do not depend on where they happen
        return logits.argmax(dim=-1)


@dataclass(frozen=True)
class SamplingParams:
    """Temperature, top-k and top-p as ``generate`` applies them, plus the seed.

    ``top_k = 0`` and ``top_p = 1.0`` disable those filters.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)
                and self.temperature > 0):
            raise SpecDecError(f"temperature must be a positive number for sampling, got {self.temperature!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise SpecDecError(f"top_k must be a non-negative int (0 disables it), got {self.top_k!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise SpecDecError(f"top_p must be in (0, 1] (1 disables it), got {self.top_p!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise SpecDecError(f"seed must be an int, got {self.seed!r}")


def process_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, top-k, top-p on ``logits`` float ``[N, V]`` (a new tensor; filtered entries -inf).

    The same operations, order and tie behaviour as transformers' TemperatureLogitsWarper,
    TopKLogitsWarper (every token tied with the k-th value is kept) and TopPLogitsWarper
    (the smallest top set whose probability exceeds ``top_p``; at least one token kept).
    Where logits tie at the top-p boundary, a stable sort breaks the tie by token id
    (transformers' unstable sort leaves that order unspecified).
    """
    scores = logits / params.temperature
    if params.top_k > 0 and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, -math.inf)
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=False, stable=True)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative <= (1 - params.top_p)
        drop_sorted[..., -1] = False  # the most probable token always stays
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, -math.inf)
    return scores


class PositionKeyedSampler:
    """Samples each node's token by inverse CDF at ``u(seed, position)``; see the module docstring."""

    name = "sample"

    def __init__(self, params: SamplingParams) -> None:
        self.params = params

    def uniforms(self, positions: Sequence[int]) -> torch.Tensor:
        """float64 ``[N]``: the uniform number of each position."""
        return torch.tensor([position_uniform(self.params.seed, p) for p in positions], dtype=torch.float64)

    def choose(self, logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``logits`` float ``[N, V]``, ``positions`` int64 ``[N]`` (of the chosen tokens) -> int64 ``[N]``."""
        probs = process_logits(logits, self.params).softmax(dim=-1).double()  # [N, V]; float64 sums
        cdf = probs.cumsum(dim=-1)  # [N, V]
        total = cdf[:, -1]
        # NaN or +inf in a row (or every entry -inf) leaves no distribution: say so rather than pick a token.
        broken = ~(total.isfinite() & (total > 0))
        if bool(broken.any()):  # host sync (one per step, as the positions below)
            rows = broken.nonzero().flatten().tolist()
            raise SpecDecError(
                f"sampling needs finite logits, got NaN or inf (no distribution) for the tokens at positions "
                f"{[int(positions[r]) for r in rows]}: the model's output is broken (its weights or dtype)"
            )
        u = self.uniforms(positions.tolist()).to(cdf.device)  # host sync: positions are tiny
        target = (u * total).unsqueeze(-1)  # [N, 1]
        tokens = torch.searchsorted(cdf, target, right=True).squeeze(-1)
        return tokens.clamp_(max=cdf.shape[-1] - 1)  # u * total < total, the clamp only guards rounding


class EosSuppressed:
    """A chooser that cannot choose an end-of-sequence id at a position before ``until``.

    ``generate``'s ``min_new_tokens`` and ``min_length``: the EOS logits are set to -inf where
    a token is chosen too early, then ``inner`` (greedy or sampling) chooses. Like every
    chooser it depends only on the logits and the position, so plain and speculative steps
    choose the same tokens. Masking commutes with the repetition penalty (applied before)
    and with temperature (-inf stays -inf), so the order is ``generate``'s.
    """

    def __init__(self, inner: TokenChooser, eos_token_ids: Sequence[int], until: int) -> None:
        self.inner = inner
        self.name = f"{getattr(inner, 'name', type(inner).__name__)}, no EOS before position {until}"
        self.eos_token_ids = [int(t) for t in eos_token_ids]
        self.until = int(until)

    def choose(self, logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``logits`` float ``[N, V]``, ``positions`` int64 ``[N]`` (of the chosen tokens) -> int64 ``[N]``."""
        early = positions < self.until  # [N]
        if bool(early.any()):  # host sync, until the first min_new_tokens positions are behind
            eos = torch.tensor(self.eos_token_ids, device=logits.device)
            blocked = logits.index_fill(1, eos, -math.inf)
            logits = torch.where(early.to(logits.device).unsqueeze(1), blocked, logits)
        return cast(torch.Tensor, self.inner.choose(logits, positions))


def penalty_mask(
    presence: torch.Tensor, tokens: Sequence[int], ancestors: np.ndarray[tuple[int, int], np.dtype[np.bool_]]
) -> torch.Tensor:
    """bool ``[N, V]``: tokens in each node's context (committed ``presence[V]`` plus its path's tokens)."""
    n = len(tokens)
    mask = presence.unsqueeze(0).expand(n, -1).clone()
    rows, cols = np.nonzero(ancestors)
    token_ids = torch.as_tensor(np.asarray(tokens, dtype=np.int64)[cols], device=mask.device)
    mask[torch.as_tensor(rows, device=mask.device), token_ids] = True
    return mask


def apply_repetition_penalty(logits: torch.Tensor, mask: torch.Tensor, penalty: float) -> torch.Tensor:
    """``generate``'s repetition penalty on ``logits`` float ``[N, V]`` where ``mask`` bool ``[N, V]`` is set."""
    penalized = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(mask, penalized, logits)


# generate() options that change which token is chosen and that specdec does not implement:
# refusing them beats silently ignoring them (the output would differ from generate's).
UNSUPPORTED_GENERATION_OPTIONS = {
    "num_beams": 1, "num_beam_groups": 1, "penalty_alpha": None, "min_p": None, "typical_p": 1.0,
    "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "diversity_penalty": 0.0, "encoder_repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0, "bad_words_ids": None, "min_length": 0, "min_new_tokens": None,
    "sequence_bias": None, "suppress_tokens": None, "begin_suppress_tokens": None, "forced_bos_token_id": None,
    "forced_eos_token_id": None, "exponential_decay_length_penalty": None, "guidance_scale": None,
    "watermarking_config": None,
}


@dataclass(frozen=True)
class Decision:
    """How a sequence's tokens are decided: the chooser, the repetition penalty, and the seed used."""

    chooser: Greedy | PositionKeyedSampler
    repetition_penalty: float = 1.0
    seed: int | None = None

    def with_seed(self, seed: int) -> Decision:
        """This decision with sampling seed ``seed`` (a batch gives each row its own); greedy stays as it is."""
        if isinstance(self.chooser, Greedy):
            return self
        params = SamplingParams(self.chooser.params.temperature, self.chooser.params.top_k, self.chooser.params.top_p,
                                seed)  # fmt: skip
        return Decision(PositionKeyedSampler(params), self.repetition_penalty, seed)


def _check_types(**options: object) -> None:
    """Each option is None or of its type: ``do_sample`` a bool, ``top_k`` and ``seed`` ints, the others numbers."""
    kinds = {"do_sample": "True, False or None", "top_k": "an int or None", "seed": "an int or None"}
    for name, value in options.items():
        if value is None:
            continue
        if name == "do_sample":
            ok = isinstance(value, bool)
        elif name in ("top_k", "seed"):
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok:
            raise SpecDecError(f"{name} must be {kinds.get(name, 'a finite number or None')}, got {value!r}")


def resolve_decision(
    generation_config: object | None,
    *,
    do_sample: bool | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    repetition_penalty: float | None = None,
    use_generation_config: bool = False,
) -> Decision:
    """Turn ``generate``-style options into a :class:`Decision`.

    Without ``use_generation_config`` only the explicit arguments count: sampling is on
    when ``do_sample=True``, or when ``temperature > 0``, ``top_k`` or ``top_p`` is given
    and ``do_sample`` is not False. With it, the model's generation config supplies the
    defaults (``do_sample``, ``temperature``, ``top_k``, ``top_p``, ``repetition_penalty``),
    explicit arguments override them, and any other option there that changes the choice
    of tokens (beam search, ``no_repeat_ngram_size``, ...) is refused. Sampling without a
    seed draws one at random; the result reports it so the run can be repeated. A value of the
    wrong type is an error that names it.
    """
    _check_types(do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    # A negative or non-finite temperature is no setting at all: without do_sample it ran greedy, silently.
    if temperature is not None and not (math.isfinite(temperature) and temperature >= 0):
        raise SpecDecError(f"temperature must be a positive number (0 or none for greedy), got {temperature!r}")
    config: dict[str, object] = {}
    if use_generation_config and generation_config is not None:
        for name, neutral in UNSUPPORTED_GENERATION_OPTIONS.items():
            value = getattr(generation_config, name, neutral)
            if value is not None and value != neutral:
                raise SpecDecError(
                    f"the model's generation config sets {name}={value!r}, which specdec does not implement; "
                    "pass use_generation_config=False and the sampling options explicitly"
                )
        for name in ("do_sample", "temperature", "top_k", "top_p", "repetition_penalty"):
            value = getattr(generation_config, name, None)
            if value is not None:
                config[name] = value
    given = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
    explicit_sampling = (temperature is not None and temperature > 0) or top_k is not None or top_p is not None
    if do_sample is None:
        do_sample = bool(config.get("do_sample", False)) or explicit_sampling
    penalty = repetition_penalty if repetition_penalty is not None else config.get("repetition_penalty", 1.0)
    if not isinstance(penalty, (int, float)) or isinstance(penalty, bool) or not penalty > 0:
        raise SpecDecError(f"repetition_penalty must be a positive number (1.0 disables it), got {penalty!r}")
    if not do_sample:
        if explicit_sampling:
            named = ", ".join(f"{k}={v!r}" for k, v in given.items() if v is not None)
            raise SpecDecError(f"{named} has no effect with do_sample=False; drop it or sample")
        return Decision(Greedy(), float(penalty))
    if temperature is not None and temperature == 0:
        raise SpecDecError("temperature=0 means greedy decoding; pass do_sample=False (or no temperature)")
    merged = {k: (v if v is not None else config.get(k)) for k, v in given.items()}
    chosen_seed = seed if seed is not None else secrets.randbits(63)
    params = SamplingParams(
        temperature=float(merged["temperature"] if merged["temperature"] is not None else 1.0),  # type: ignore[arg-type]
        top_k=int(merged["top_k"] or 0),  # type: ignore[call-overload]
        top_p=float(merged["top_p"] if merged["top_p"] is not None else 1.0),  # type: ignore[arg-type]
        seed=chosen_seed,
    )
    return Decision(PositionKeyedSampler(params), float(penalty), chosen_seed)
