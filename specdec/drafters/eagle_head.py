"""The EAGLE draft head: a one-layer network that predicts the target's next hidden state; its file.

EAGLE (Li et al., *EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty*, 2024)
drafts at the level of features: given the target's hidden state ``f_t`` at position ``t`` and
the embedding ``e_{t+1}`` of the token that follows it, a small network predicts ``f_{t+1}``,
and the target's own LM head turns the prediction into draft logits. Symbols here:

- ``f_t`` float ``[H]``: the **feature** of position ``t``, the target's last hidden state there,
  after its final norm (the LM head's input; EAGLE reads it before the norm: see below);
- ``e_{t+1}`` float ``[H]``: the target's input embedding of token ``x_{t+1}``;
- the head: ``z = layer(fc([e_{t+1}; f_t]))`` with ``fc`` a linear map ``2H -> H`` and ``layer``
  one decoder layer of the target's own architecture (built from its config, own weights);
  ``f^_{t+1} = norm(z)`` with the target's final norm; logits ``lm_head(f^_{t+1})``.

**Why the feature after the final norm.** It is what every engine computes anyway (the LM head's
input; transformers 5 reports it as the last of ``hidden_states``), so a verifier hands it to the
drafter at no cost, and the regression target has the norm's bounded scale, not the residual
stream's outlier dimensions. The head's own output goes through the same norm, so what it feeds
back at the next depth lives in the space it reads.

**Draft vocabulary.** On the default model the LM head is a fifth of the target's weights, so the
head scores only ``draft_vocab`` (the tokens the target predicted most often on the training
corpus, as EAGLE-3's draft vocabulary): a ``[V_d, H]`` gather of the target's LM head, made at load.
Lossless whatever it leaves out: the target verifies every draft.

**The file** (``.safetensors``): only the head's own weights (``fc.*``, ``layer.*``), stored in
float16, the draft vocabulary (int64 ``draft_vocab`` ``[V_d]``), and metadata naming what the head
was trained for (``hidden_size``, ``vocab_size``, ``num_hidden_layers`` of the target,
``model_type``, ``head_layers``) and how (``trained``: the command's settings and result, JSON). The
embeddings, final norm and LM head are the target's, never stored. :func:`load_head` checks all
of it against the target before building anything and raises :class:`HeadFileError` naming the
first mismatch; a truncated or foreign file raises the same, and nothing is half-loaded.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch

from specdec.drafters.model_draft import model_parts
from specdec.errors import SpecDecError

FORMAT = "specdec-eagle-head"
FORMAT_VERSION = 1
# The head shipped for the default model (docs/algorithms/eagle.md says how it was trained).
DEFAULT_HEAD = "data/eagle_smollm2.safetensors"


class HeadFileError(SpecDecError):
    """An EAGLE head file that cannot serve this target: malformed, truncated, or made for another model."""


def _parts(model: Any) -> tuple[Any, Any, Any, Any]:
    """The target's embeddings, final norm, LM head and rotary embedding, or a clear error."""
    embed, norm, lm_head, rotary, _ = model_parts(model, "eagle", ("embed_tokens", "norm", "lm_head", "rotary_emb",
                                                                  "layers"))  # fmt: skip
    return embed, norm, lm_head, rotary


def target_facts(model: Any) -> dict[str, Any]:
    """What a head file must match: the target's hidden size, vocabulary, layer count and type."""
    config = model.config
    return {
        "hidden_size": int(config.hidden_size),
        "vocab_size": int(model.get_output_embeddings().weight.shape[0]),
        "num_hidden_layers": int(config.num_hidden_layers),
        "model_type": str(getattr(config, "model_type", "")),
    }


class EagleHead(torch.nn.Module):
    """``fc`` (``2H -> H``) and one decoder layer of the target's architecture; the rest is the target's.

    ``model``: the target (read, never changed: its modules are referenced, not registered here, so
    ``state_dict()`` holds the head's own weights only); ``draft_vocab`` int64 ``[V_d]``: the token ids
    the head scores (None: the whole vocabulary); ``dtype``: the head's own weights' and the LM-head
    rows' (None: the target's). The target's embeddings and final norm run in the target's dtype;
    their outputs are cast. Features come back in the target's dtype.
    """

    def __init__(self, model: Any, draft_vocab: torch.Tensor | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        embed, norm, lm_head, rotary = _parts(model)
        layer_type = type(model.model.layers[0])
        config = copy.deepcopy(model.config)
        config.num_hidden_layers = 1
        if isinstance(getattr(config, "layer_types", None), list):
            config.layer_types = config.layer_types[:1]
        weight = lm_head.weight  # [V, H]
        hidden = int(config.hidden_size)
        self.hidden_size = hidden
        self.config = config
        own = dtype or weight.dtype
        self.target_dtype = weight.dtype
        self.fc = torch.nn.Linear(2 * hidden, hidden, bias=True, dtype=own, device=weight.device)
        self.layer = layer_type(config, 0).to(dtype=own, device=weight.device)
        from specdec.models import cache_keyword  # imports transformers: at first use, not with specdec.drafters

        self._cache_keyword = cache_keyword(self.layer)  # "cache" or "past_key_values", by transformers release
        # The target's modules, outside the module tree (a tuple hides them from state_dict and .parameters()).
        self._target = (embed, norm, rotary)
        vocab = torch.arange(weight.shape[0]) if draft_vocab is None else draft_vocab.to(torch.long)
        self.draft_vocab = vocab.to(weight.device)  # int64 [V_d]
        # The draft vocabulary's rows of the LM head: a copy of [V_d, H] (the head's bias, if any, likewise).
        self._head_weight = weight.detach()[self.draft_vocab].to(own)
        bias = getattr(lm_head, "bias", None)
        self._head_bias = None if bias is None else bias.detach()[self.draft_vocab].to(own)

    @property
    def attention(self) -> str:
        return str(getattr(self.config, "_attn_implementation", None) or "eager")

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The target's input embeddings of ``tokens`` int64 ``[B, T]``: float ``[B, T, H]``."""
        out: torch.Tensor = self._target[0](tokens)
        return out

    def forward(
        self, features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
        mask: torch.Tensor | None = None, cache: Any = None,
    ) -> torch.Tensor:  # fmt: skip
        """Predicted features ``[B, T, H]`` (after the final norm) from ``features`` ``[B, T, H]`` (``f_t``),
        the next ``tokens`` int64 ``[B, T]`` and ``positions`` int64 ``[B, T]``.

        ``mask``: an additive float ``[B, 1, T, S]`` over the cached and new keys (None: causal over the
        new ones, as in training); ``cache``: a transformers cache the layer writes its keys and values to.
        """
        own = self.fc.weight.dtype
        x = self.fc(torch.cat([self.embed(tokens).to(own), features.to(own)], dim=-1))  # [B, T, H]
        rotary = self._target[2](x, positions)
        extra: dict[str, Any] = {}
        if cache is not None:
            extra = {self._cache_keyword: cache, "use_cache": True}
        out = self.layer(x, attention_mask=mask, position_ids=positions, position_embeddings=rotary, **extra)
        z = out[0] if isinstance(out, tuple) else out
        predicted: torch.Tensor = self._target[1](z.to(self.target_dtype))
        return predicted

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits ``[..., V_d]`` of ``features`` ``[..., H]``."""
        return torch.nn.functional.linear(features.to(self._head_weight.dtype), self._head_weight, self._head_bias)

    def own_state(self) -> dict[str, torch.Tensor]:
        """The head's own weights (``fc.*``, ``layer.*``): what its file stores."""
        return {name: tensor.detach() for name, tensor in self.state_dict().items()}


def save_head(head: EagleHead, model: Any, path: str | Path, trained: dict[str, Any]) -> None:
    """Write ``head``'s own weights (float16), its draft vocabulary and metadata to ``path`` (safetensors)."""
    from safetensors.torch import save_file

    tensors = {name: t.to(torch.float16).contiguous().cpu() for name, t in head.own_state().items()}
    tensors["draft_vocab"] = head.draft_vocab.cpu().contiguous()
    metadata = {key: str(value) for key, value in target_facts(model).items()}
    metadata.update(format=FORMAT, version=str(FORMAT_VERSION), head_layers="1", trained=json.dumps(trained))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(path).with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata=metadata)
    tmp.replace(path)


def _read(path: Path) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    from safetensors import safe_open

    if not path.is_file():
        raise HeadFileError(f"EAGLE head file {str(path)!r} does not exist")
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = dict(handle.metadata() or {})
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118 (not a dict)
    except Exception as error:  # safetensors raises its own types for truncated or foreign files
        raise HeadFileError(f"EAGLE head file {str(path)!r} cannot be read ({type(error).__name__}: {error}); "
                            "it is truncated or not a safetensors file") from error  # fmt: skip
    return metadata, tensors


def head_metadata(path: str | Path) -> dict[str, Any]:
    """The metadata of the head file at ``path`` (``trained`` decoded), checked to be a head file."""
    metadata, _ = _read(Path(path))
    if metadata.get("format") != FORMAT:
        raise HeadFileError(f"{str(path)!r} is not an EAGLE head file (format {metadata.get('format')!r})")
    out: dict[str, Any] = dict(metadata)
    out["trained"] = json.loads(metadata.get("trained", "{}"))
    return out


def load_head(path: str | Path, model: Any, dtype: torch.dtype | None = None) -> EagleHead:
    """The head stored at ``path``, for target ``model`` (on its device, in ``dtype``, None: the target's); every
    check first.

    Raises :class:`HeadFileError` for a missing, truncated or foreign file, a format version this
    release does not read, a target of another hidden size, vocabulary, layer count or type, a
    draft vocabulary out of range, and a missing, extra or misshapen weight.
    """
    path = Path(path)
    metadata, tensors = _read(path)
    if metadata.get("format") != FORMAT:
        raise HeadFileError(f"{str(path)!r} is not an EAGLE head file (format {metadata.get('format')!r})")
    if metadata.get("version") != str(FORMAT_VERSION):
        raise HeadFileError(f"EAGLE head file {str(path)!r} has format version {metadata.get('version')!r}; "
                            f"this release reads version {FORMAT_VERSION}")  # fmt: skip
    facts = target_facts(model)
    for key, value in facts.items():
        if metadata.get(key) != str(value):
            raise HeadFileError(f"EAGLE head file {str(path)!r} was trained for a target with {key} = "
                                f"{metadata.get(key)!r}, and this target has {value!r}")  # fmt: skip
    if metadata.get("head_layers") != "1":
        raise HeadFileError(f"EAGLE head file {str(path)!r} has {metadata.get('head_layers')!r} layers; "
                            "this release runs one-layer heads")  # fmt: skip
    vocab = tensors.pop("draft_vocab", None)
    if vocab is None or vocab.dim() != 1 or vocab.dtype != torch.int64 or vocab.numel() == 0:
        raise HeadFileError(f"EAGLE head file {str(path)!r}: draft_vocab must be a non-empty int64 vector")
    if int(vocab.min()) < 0 or int(vocab.max()) >= facts["vocab_size"] or len(set(vocab.tolist())) != vocab.numel():
        raise HeadFileError(f"EAGLE head file {str(path)!r}: draft_vocab holds ids outside [0, "
                            f"{facts['vocab_size']}) or repeated ids")  # fmt: skip
    head = EagleHead(model, vocab, dtype)
    expected = {name: tuple(t.shape) for name, t in head.state_dict().items()}
    got = {name: tuple(t.shape) for name, t in tensors.items()}
    if set(expected) != set(got):
        missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
        raise HeadFileError(f"EAGLE head file {str(path)!r}: weights "
                            + (f"missing {missing[0]!r}" if missing else f"unexpected {extra[0]!r}"))  # fmt: skip
    for name, shape in expected.items():
        if got[name] != shape:
            raise HeadFileError(f"EAGLE head file {str(path)!r}: {name} has shape {got[name]}, expected {shape}")
    head.load_state_dict(tensors, strict=True)  # casts float16 to the head's dtype
    return head.eval()
