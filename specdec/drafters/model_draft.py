"""Drafters that run a model: a separate draft model, or the target's own first layers (early exit).

Both draft a **greedy chain**: from the pending token, ``length`` times the draft forward's
argmax, each token fed back as the next input. The draft forward keeps its own KV cache (a
transformers ``DynamicCache``) of the tokens it has seen, so that each proposal feeds only what
is new since the last one:

- ``cached``: the tokens whose keys and values are in the draft cache, in order. After a
  proposal they are ``committed + [pending] + draft[:-1]`` (the last draft token is never fed).
- at the next proposal the sequence is ``committed' + [pending']``, where ``committed'`` grew
  by what the target accepted. The longest common prefix of the two (a committed prefix, so it
  only needs comparing past the committed length of the last proposal) stays; the cache is
  cropped to it (the rejected draft tokens go) and the rest of the sequence is fed in one
  forward, whose last logits give the first draft token. Accepted draft tokens are thus never
  recomputed, and a proposal costs one catch-up forward plus ``length - 1`` one-token forwards.

The state a proposal needs is the committed tokens (:meth:`ModelDrafter.reset`,
:meth:`ModelDrafter.update`); the cache is a memo of them that :meth:`ModelDrafter.propose`
brings up to date, so a step that skips drafting (a batch's gate) costs nothing here and the
next proposal catches up.

Two kinds:

- ``drafter="model"``, option ``draft_model``: any Hugging Face causal LM with the target's
  vocabulary (what ``assistant_model`` is in ``generate``), e.g. a small model of the same family.
- ``drafter="early-exit"``, option ``layers``: the target's first ``layers`` decoder layers,
  then its final norm and LM head (what ``assistant_early_exit`` is in ``generate``; Elhoushi
  et al., *LayerSkip*, 2024). No extra weights: a view of the target
  (:func:`early_exit_view`) shares its modules and changes nothing in it.

Costs: per proposal ``length`` draft forwards (the first over the tokens new since the last
proposal, usually ``accepted + 1``); memory: the draft cache, ``2 * layers * kv_heads * head_dim``
values per token of the sequence. Drafts are verified like any other, so the output is the
target's own whatever the draft model says.
"""

from __future__ import annotations

import copy
import inspect
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from specdec.drafters.base import DrafterContext, Factory, parse_options, require_positive
from specdec.errors import SpecDecError
from specdec.types import DrafterFactory, DraftTree, Feedback

DEFAULT_LENGTH = 4


class ModelDrafter:
    """Drafts a greedy chain with ``model``'s forward and a KV cache kept in step with the committed tokens.

    ``model``: a Hugging Face causal LM module (its forward takes ``input_ids``, its KV cache under
    ``cache`` or ``past_key_values`` and ``use_cache``, and returns ``logits`` ``[1, n, V]``); ``name``:
    the drafter's name (``"model"``, ``"early-exit"``); ``length``: draft tokens per proposal (the
    engine's ``max_nodes`` caps it). Past the draft model's ``max_position_embeddings`` (a draft
    model with a shorter context than the target's) it drafts nothing.
    """

    feedback_topk = 0

    def __init__(self, model: Any, name: str, length: int = DEFAULT_LENGTH) -> None:
        self.model = model
        self.name = name
        self.length = length
        from specdec.models import cache_keyword  # imports transformers: at first use, not with specdec.drafters

        positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        self.context_length: int | None = positions if isinstance(positions, int) else None
        self.device = next(model.parameters()).device
        self._cache_keyword = cache_keyword(model)  # "cache" or "past_key_values", by transformers release
        # Only the last position's logits are needed: the catch-up forward skips the LM head elsewhere.
        self._keep_last = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.committed: list[int] = []
        self.cached: list[int] = []  # the tokens whose K/V the cache holds, in order
        self._stable = 0  # cached[:_stable] is a prefix of committed (the committed length at the last proposal)
        self.cache: Any = None

    def reset(self, prompt: Sequence[int], feedback: Feedback | None = None) -> None:
        from transformers import DynamicCache

        self.committed = [int(t) for t in prompt]
        self.cached = []
        self._stable = 0
        self.cache = DynamicCache()  # full-attention layers: every token kept, so any prefix can be cropped to

    def update(self, accepted: Sequence[int], feedback: Feedback | None) -> None:
        self.committed.extend(int(t) for t in accepted)

    def cache_length(self) -> int:
        """Tokens whose keys and values the draft cache holds (equal to ``len(cached)``)."""
        return 0 if self.cache is None else int(self.cache.get_seq_length())

    def _forward(self, tokens: Sequence[int]) -> int:
        """Feed ``tokens`` after the cached ones; the argmax of the last position's logits."""
        from specdec.models import returned_cache

        ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.device)  # [1, n]
        extra: dict[str, Any] = {"logits_to_keep": 1} if self._keep_last else {}
        extra[self._cache_keyword] = self.cache
        output = self.model(input_ids=ids, use_cache=True, **extra)
        self.cache = returned_cache(output)
        self.cached.extend(tokens)
        # One host sync per draft token: the next input is this token.
        return int(output.logits[0, -1].argmax())

    def _catch_up(self, sequence: list[int]) -> list[int]:
        """Crop the cache to its longest prefix shared with ``sequence``; the tokens still to feed (never none)."""
        keep = self._stable
        limit = min(len(self.cached), len(sequence) - 1)  # at least the last token is fed: its logits are needed
        while keep < limit and self.cached[keep] == sequence[keep]:
            keep += 1
        if keep < len(self.cached):
            self.cache.crop(keep - len(self.cached))  # a negative count removes that many (transformers 5.0-5.24)
            del self.cached[keep:]
        return sequence[keep:]

    @torch.no_grad()
    def propose(self, pending: int, max_nodes: int) -> DraftTree:
        count = min(self.length, max_nodes - 1)
        if self.context_length is not None:  # the last draft token is never fed: its position may be the limit
            count = min(count, self.context_length - len(self.committed))
        if count < 1:
            return DraftTree.single(pending, self.name)
        sequence = [*self.committed, pending]
        draft = [self._forward(self._catch_up(sequence))]
        self._stable = len(self.committed)
        while len(draft) < count:
            draft.append(self._forward(draft[-1:]))
        return DraftTree.chain(pending, draft, source=self.name)


# -- early exit: a view of the target's first layers ---------------------------------------------
def _shallow(module: torch.nn.Module) -> Any:
    """A new module object sharing ``module``'s submodules, parameters and buffers (its own tables of them)."""
    clone = copy.copy(module)
    clone._modules = dict(module._modules)
    clone._parameters = dict(module._parameters)
    clone._buffers = dict(module._buffers)
    return clone


def model_parts(model: Any, drafter: str, names: Sequence[str]) -> list[Any]:
    """The parts ``names`` of the usual causal-LM layout (``"lm_head"``: ``model.lm_head``; any other:
    ``model.model.<name>``) that ``drafter`` reads, in order; a clear error naming the first one missing."""
    inner = getattr(model, "model", None)
    found = [getattr(model if name == "lm_head" else inner, name, None) for name in names]
    missing = [("model." if name == "lm_head" else "model.model.") + name
               for name, part in zip(names, found, strict=True) if part is None]  # fmt: skip
    if missing:
        raise SpecDecError(
            f"drafter {drafter!r} needs the usual causal-LM layout ({', '.join(names)}); "
            f"{type(model).__name__} has no {missing[0]}"
        )
    return found


def decoder_layers(model: Any) -> Any:
    """``model.model.layers`` of the usual causal-LM layout, with its final norm and LM head; else a clear error."""
    layers = model_parts(model, "early-exit", ("layers", "norm", "lm_head"))[0]
    if not isinstance(layers, torch.nn.ModuleList):
        raise SpecDecError(f"drafter 'early-exit': model.model.layers is a {type(layers).__name__}, not a ModuleList")
    return layers


def early_exit_view(model: Any, layers: int) -> Any:
    """``model`` cut after its first ``layers`` decoder layers: its forward runs those, the final norm, the LM head.

    A new pair of module objects (the causal LM and its inner model) holding the target's own
    embeddings, layers, norm and head, and a copy of its config with ``num_hidden_layers =
    layers`` (``layer_types`` cut to match): nothing in ``model`` changes, and no weight is copied.
    """
    all_layers = decoder_layers(model)
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= len(all_layers):
        raise SpecDecError(
            f"drafter 'early-exit': layers must be an int in [1, {len(all_layers)}] (the target's decoder layers), "
            f"got {layers!r}"
        )
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = layers
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = config.layer_types[:layers]
    inner = _shallow(model.model)
    inner.layers = torch.nn.ModuleList(list(all_layers)[:layers])
    inner.config = config
    view = _shallow(model)
    view.model = inner
    view.config = config
    return view


# -- the factories ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class EarlyExitConfig:
    """``layers``: the target's first decoder layers the draft runs (None: a quarter of them, at least 1);
    ``length``: draft tokens per proposal."""

    layers: int | None = None
    length: int = DEFAULT_LENGTH

    def __post_init__(self) -> None:
        require_positive("early-exit", length=self.length)


@dataclass(frozen=True)
class DraftModelConfig:
    """``draft_model``: a Hugging Face causal LM with the target's vocabulary, or its local checkpoint directory
    (``"default"``: the default model); ``length``: draft tokens per proposal."""

    draft_model: Any = None
    length: int = DEFAULT_LENGTH

    def __post_init__(self) -> None:
        require_positive("model", length=self.length)


def output_vocab(model: Any) -> int:
    """How many logits ``model``'s LM head gives (its output embedding's rows, else ``config.vocab_size``)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    if isinstance(weight, torch.Tensor):
        return int(weight.shape[0])
    return int(model.config.vocab_size)


def early_exit_factory(options: Mapping[str, Any], context: DrafterContext) -> DrafterFactory:
    config = parse_options(EarlyExitConfig, "early-exit", options)
    if context.model is None:
        raise SpecDecError(
            "drafter 'early-exit' drafts with the target model's own first layers, and this caller gave no target "
            "model (DrafterContext.model); use it through specdec.run or Generator"
        )
    total = len(decoder_layers(context.model))
    layers = config.layers if config.layers is not None else max(1, total // 4)
    view = early_exit_view(context.model, layers)  # checked here, shared by every drafter (it holds no state)
    return Factory("early-exit", lambda: ModelDrafter(view, "early-exit", config.length))


def load_draft_model(path: str | os.PathLike[str], target: Any) -> Any:
    """The causal LM at local checkpoint ``path`` (or ``"default"``), on the target's device in its dtype.

    Loaded once per factory (:func:`specdec.models.load_model`: nothing is downloaded); a command
    line's ``--option draft_model=PATH`` comes here. Without a target: the checkpoint's own dtype, on the CPU.
    """
    from specdec.models import load_model

    where = next(target.parameters()) if target is not None else None
    model, _ = load_model(path, dtype=None if where is None else where.dtype,
                          device=None if where is None else where.device)  # fmt: skip
    return model


def draft_model_factory(options: Mapping[str, Any], context: DrafterContext) -> DrafterFactory:
    config = parse_options(DraftModelConfig, "model", options)
    draft = config.draft_model
    if draft is None:
        raise SpecDecError(
            "drafter 'model' needs draft_model=, a Hugging Face causal LM with the target's vocabulary "
            "(drafter_options={'draft_model': model}) or its local checkpoint directory"
        )
    if isinstance(draft, (str, os.PathLike)):
        draft = load_draft_model(draft, context.model)
    if not isinstance(draft, torch.nn.Module) or not callable(getattr(draft, "forward", None)):
        raise SpecDecError(
            f"drafter 'model': draft_model must be a Hugging Face causal LM or a checkpoint directory, "
            f"got {type(draft).__name__}"
        )
    draft_vocab = output_vocab(draft)
    target_vocab = context.vocab_size if context.model is None else output_vocab(context.model)
    if target_vocab is not None and draft_vocab != target_vocab:
        raise SpecDecError(
            f"drafter 'model': the draft model's vocabulary has {draft_vocab} tokens and the target's {target_vocab}; "
            "a draft model must share the target's tokenizer and vocabulary"
        )
    return Factory("model", lambda: ModelDrafter(draft, "model", config.length))
