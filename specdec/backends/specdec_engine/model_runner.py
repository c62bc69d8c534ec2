"""specdec's own forward of a Llama-family decoder, over the model's own modules and weights.

Why not the model's ``forward``: a Hugging Face forward is written for every use at once,
and verification pays for that on the CPU at every step: per-layer wrappers (keyword
deprecation, output capture), a mask built per call, grouped KV heads repeated to the
query heads whenever a mask is passed (a copy of the whole cache per layer: every tree
verification), the cache as one concatenation per layer per step (``DynamicCache``), and
linear layers that stream their weights at about a third of the machine's bandwidth.
Switching pieces of the model in and out around each forward (what specdec did before)
changes the user's model while it runs, which another thread can see.

:class:`DecoderRunner` is the forward of the architectures whose decoder layer is Llama's
(:data:`ARCHITECTURES`: Llama, Mistral, Qwen2 with its biases, Qwen3 with its per-head
norms), written out: the model's own embedding, norms, rotary embedding, activation and
``apply_rotary_pos_emb`` are called as they are (so their numerics are the model's), the
linear layers' weights are read in place through the verifier's linear kernel (e.g.
:func:`specdec.backends.specdec_engine.cpu_kernels.skinny_linear`, several weights of one input in one call), attention
is one
``scaled_dot_product_attention`` per layer over the grouped heads as they are (no repeat),
and keys and values go straight into a :class:`~specdec.backends.slot_cache.StaticKVCache`
at the tree's slots. Nothing of the model is changed or wrapped; a runner holds references
only, so many verifiers (and threads) can share one.

With specdec's CPU kernels the whole layer loop can run as one C++ call
(:func:`specdec.backends.specdec_engine.cpu_kernels.decoder_layers`: the same ATen operations and kernels,
without ~60 Python-level operations per layer, ~2 ms of a default-model forward here); the
runner hands it a model only after a probe on random rows gave the loop's bits
(:meth:`DecoderRunner.layers_in_one_call`), so a model whose norm, rotary or activation is not
the one the op writes out keeps the loop.

Numerics: with ``torch.nn.functional.linear`` as the kernel, the runner performs the
model's ``sdpa`` forward operation for operation (the tests compare logits on tiny fp64
models of each architecture). With the skinny kernels, whose rows are batch-invariant, a
tree node's logits equal the same token's logits from a one-token forward bit for bit on
the linear layers; attention over a masked tree is the one place rows meet.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F

from specdec.backends.slot_cache import StaticKVCache
from specdec.backends.specdec_engine.cpu_kernels import LayerWeights
from specdec.errors import UnsupportedModelError
from specdec.gguf_weights import GgufBlocksLinear

# model_type values whose decoder layer is Llama's (norm -> attention -> residual -> norm -> MLP -> residual).
ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")

Linear = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]
# (query [1, Hq, R, D], [(keys, values, start, rows, ancestors | None) per segment], scale) -> [1, R, Hq * D]
AttentionSegments = Callable[
    [torch.Tensor, Sequence[tuple[torch.Tensor, torch.Tensor, int, int, "torch.Tensor | None"]], float], torch.Tensor
]
# (key, value [1, Hkv, R, D], [(keys, values) cache layer per segment], starts, counts) -> None
WriteSegments = Callable[
    [torch.Tensor, torch.Tensor, Sequence[tuple[torch.Tensor, torch.Tensor]], Sequence[int], Sequence[int]], None
]
# (x, [(weight, bias), ...]) -> [linear(x, weight, bias), ...]: several weights of one input at once
Linears = Callable[[torch.Tensor, Sequence[tuple[torch.Tensor, "torch.Tensor | None"]]], list[torch.Tensor]]
# (hidden [1, R, E], cos, sin [1, R, D], layer weights, (Hq, Hkv), rotary together, scale,
#  caches [layer][segment] (keys, values), starts, counts, ancestors per segment) -> hidden after every layer
DecoderLayers = Callable[..., torch.Tensor]
# (query [1, Hq, T, D], keys, values [1, Hkv, S, D], start, ancestors [T, T] | None, scale) -> [1, T, Hq * D]
Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, "torch.Tensor | None", float], torch.Tensor]


@dataclass(frozen=True)
class _Layer:
    """One decoder layer's pieces: the model's own modules and weight tensors (references, no copies)."""

    input_norm: Any
    post_norm: Any
    q_norm: Any  # per-head norm of the queries (Qwen3), else None
    k_norm: Any
    q: tuple[torch.Tensor, torch.Tensor | None]  # (weight [Hq*D, E], bias [Hq*D] or None)
    k: tuple[torch.Tensor, torch.Tensor | None]
    v: tuple[torch.Tensor, torch.Tensor | None]
    o: tuple[torch.Tensor, torch.Tensor | None]
    gate: tuple[torch.Tensor, torch.Tensor | None]
    up: tuple[torch.Tensor, torch.Tensor | None]
    down: tuple[torch.Tensor, torch.Tensor | None]
    act: Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Segment:
    """One sequence's part of a forward: ``T`` new tokens written after ``start`` committed ones.

    ``tokens``, ``positions`` int64 ``[1, T]``; the new keys and values go to slots
    ``start .. start+T-1`` of ``cache`` and attention reads its slots ``0 .. start+T-1``: every
    row sees the committed slots ``[0, start)`` and, of the new ones, those of its tree
    ancestors and itself (``ancestors`` bool ``[T, T]``), or with ``ancestors=None`` those at
    or before it (a causal pass: a prefill, a plain step, a chain). ``last_only``: only the
    last row's logits.
    """

    tokens: torch.Tensor
    positions: torch.Tensor
    cache: StaticKVCache
    start: int
    ancestors: torch.Tensor | None = None
    last_only: bool = False

    def mask(self) -> torch.Tensor | None:
        """The bool attention mask ``[1, 1, T, start+T]`` for ``scaled_dot_product_attention``.

        None where SDPA's own causal flag says the same: one row (it sees everything), or a
        causal pass from slot 0 (a prefill). SDPA aligns its causal mask to the top left, so a
        causal pass after committed slots needs the mask written out.
        """
        rows = self.tokens.shape[1]
        visible = self.ancestors
        if visible is None:
            if rows == 1 or self.start == 0:
                return None
            visible = torch.ones((rows, rows), dtype=torch.bool, device=self.tokens.device).tril()
        committed = visible.new_ones((rows, self.start))
        return torch.cat([committed, visible], dim=1)[None, None]


@dataclass(frozen=True)
class Kernels:
    """How a forward computes: ``linear(x, weight, bias)`` for every linear layer, and
    ``attention`` (:func:`specdec.backends.specdec_engine.cpu_kernels.tree_attention`'s signature) for the
    attention of each segment, or None for ``torch.nn.functional.scaled_dot_product_attention``.
    ``linears`` (optional): the same products as ``linear`` for several weights of one input in one
    call (:func:`specdec.backends.specdec_engine.cpu_kernels.skinny_linears`): the query/key/value and the
    gate/up projections. ``attention_segments`` (optional, with ``attention``): every segment's
    attention in one call (:func:`specdec.backends.specdec_engine.cpu_kernels.tree_attention_segments`), with
    ``write_segments`` (:func:`specdec.backends.specdec_engine.cpu_kernels.write_segments`) writing every segment's
    cache beforehand; a batch runs segment by segment unless both are given. ``layers``
    (optional, with all of the above): the whole layer loop in one call
    (:func:`specdec.backends.specdec_engine.cpu_kernels.decoder_layers`), taken where the runner's probe found it
    bitwise equal to the loop written out here (:meth:`DecoderRunner.layers_in_one_call`). ``blocks``: the
    linear kernels take GGUF blocks (:mod:`specdec.backends.specdec_engine.gguf_blocks`), so the runner
    hands them the blocks it holds in place of the float32 weights they stand for (the same bits)."""

    linear: Linear
    attention: Attention | None = None
    linears: Linears | None = None
    attention_segments: AttentionSegments | None = None
    write_segments: WriteSegments | None = None
    layers: DecoderLayers | None = None
    blocks: bool = False

    def group(self, x: torch.Tensor, *layers: tuple[torch.Tensor, torch.Tensor | None]) -> list[torch.Tensor]:
        """``linear(x, weight, bias)`` for each of ``layers``: by ``linears`` in one call where given."""
        if self.linears is not None:
            return self.linears(x, layers)
        return [self.linear(x, *layer) for layer in layers]


def _weights(linear: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    return linear.weight, linear.bias


# The linear modules the runner reads: torch's, and GGUF blocks-only layers (their weight: the blocks it is handed).
_LINEARS = (torch.nn.Linear, GgufBlocksLinear)


def unsupported_reason(model: Any) -> str | None:
    """Why :class:`DecoderRunner` cannot run ``model``, or None when it can."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in ARCHITECTURES:
        return f"architecture {model_type!r} (the runner knows {', '.join(ARCHITECTURES)})"
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return f"attention implementation {getattr(config, '_attn_implementation', None)!r} (the runner is sdpa's)"
    base = getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    if base is None or layers is None or not hasattr(base, "rotary_emb") or not hasattr(model, "lm_head"):
        return "the module layout is not Llama's (model.model.layers, rotary_emb, lm_head)"
    if getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True):
        return "sliding-window attention"
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return "layers other than full attention"
    for layer in layers:
        attention, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        names = ("q_proj", "k_proj", "v_proj", "o_proj")
        if attention is None or mlp is None or not all(hasattr(attention, name) for name in names):
            return "a decoder layer without Llama's attention and MLP"
        modules = [getattr(attention, name) for name in names]
        modules += [getattr(mlp, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
        if any(type(m) not in _LINEARS or "forward" in m.__dict__ for m in modules):
            return "linear layers that are not plain torch.nn.Linear (quantized, adapted or hooked)"
    if type(model.lm_head) not in _LINEARS:
        return "an output head that is not a plain torch.nn.Linear"
    return None


class DecoderRunner:
    """The forward of a Llama-family decoder over a :class:`StaticKVCache` (module docstring).

    ``model``: a model :func:`unsupported_reason` accepts (it raises
    :class:`~specdec.errors.UnsupportedModelError` naming the reason otherwise). The runner reads
    the model's tensors at every call, so an in-place weight update is seen at the next forward.
    ``blocks``: GGUF blocks standing for some of the model's linear weights, by parameter name
    (:class:`~specdec.backends.specdec_engine.gguf_blocks.GgufWeights`), which kernels that take
    blocks (``Kernels.blocks``) read in their place; those weights' in-place updates are not seen.
    ``only_copy``: the blocks are the only copy of those weights (a blocks-only model: its tensors are
    placeholders), so kernels that do not take blocks are refused.
    """

    def __init__(self, model: Any, blocks: Mapping[str, torch.Tensor] | None = None, only_copy: bool = False) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            # an UnsupportedModelError (a ValueError) like every other engine's refusal of a model
            raise UnsupportedModelError(f"the decoder runner cannot run this model: {reason}; engine='hf' (or "
                                        "'auto') runs it")
        base = model.model
        config = model.config
        self.embed = base.embed_tokens
        self.rotary = base.rotary_emb
        self.final_norm = base.norm
        self.head = _weights(model.lm_head)
        first = base.layers[0].self_attn
        self.head_dim: int = first.head_dim
        self.scaling: float = first.scaling
        self.query_heads: int = config.num_attention_heads
        self.kv_heads: int = config.num_key_value_heads
        # The model's own rotary function (a module-level function of its modeling file).
        self.apply_rotary = sys.modules[type(first).__module__].apply_rotary_pos_emb
        self.layers = [
            _Layer(
                layer.input_layernorm,
                layer.post_attention_layernorm,
                getattr(layer.self_attn, "q_norm", None),
                getattr(layer.self_attn, "k_norm", None),
                _weights(layer.self_attn.q_proj),
                _weights(layer.self_attn.k_proj),
                _weights(layer.self_attn.v_proj),
                _weights(layer.self_attn.o_proj),
                _weights(layer.mlp.gate_proj),
                _weights(layer.mlp.up_proj),
                _weights(layer.mlp.down_proj),
                layer.mlp.act_fn,
            )
            for layer in base.layers
        ]
        self.num_layers = len(self.layers)
        self.rotary_together = self._rotary_works_on_heads_together(model)
        self.layer_weights = self._layer_weights(self.layers)
        # The same with GGUF blocks in place of the float32 weights they stand for, where given.
        self.block_parts: tuple[list[_Layer], LayerWeights | None, tuple[torch.Tensor, torch.Tensor | None]] | None
        self.block_parts = None
        self.only_copy = only_copy
        if blocks:
            swap = {id(tensor): blocks[name] for name, tensor in model.named_parameters(remove_duplicate=False)
                    if name in blocks}  # fmt: skip

            def sub(pair: tuple[torch.Tensor, torch.Tensor | None]) -> tuple[torch.Tensor, torch.Tensor | None]:
                return swap.get(id(pair[0]), pair[0]), pair[1]

            layers = [
                replace(layer, q=sub(layer.q), k=sub(layer.k), v=sub(layer.v), o=sub(layer.o), gate=sub(layer.gate),
                        up=sub(layer.up), down=sub(layer.down))
                for layer in self.layers
            ]  # fmt: skip
            self.block_parts = (layers, self._layer_weights(layers), sub(self.head))
        # whether the op gave the loop's bits, per (op, blocks, dtype, device)
        self._probed: dict[tuple[int, bool, torch.dtype, torch.device], bool] = {}

    def _parts(
        self, kernels: Kernels
    ) -> tuple[list[_Layer], LayerWeights | None, tuple[torch.Tensor, torch.Tensor | None]]:
        """The layers, their flattened weights and the head ``kernels`` read: with GGUF blocks where the kernels
        take them and the runner has them, else the model's tensors."""
        if kernels.blocks and self.block_parts is not None:
            return self.block_parts
        assert not self.only_copy, "kernels without GGUF blocks on a blocks-only model (its weights: placeholders)"
        return self.layers, self.layer_weights, self.head

    def _layer_weights(self, layers: Sequence[_Layer]) -> LayerWeights | None:
        """The layers' tensors flattened for ``Kernels.layers``, or None where that op cannot express the
        layer: per-head query/key norms (Qwen3), norms without one ``variance_epsilon``, or hooked norms."""
        norms = [norm for layer in layers for norm in (layer.input_norm, layer.post_norm)]
        if any(layer.q_norm is not None for layer in layers):
            return None
        eps = {getattr(norm, "variance_epsilon", None) for norm in norms}
        (value,) = eps if len(eps) == 1 else (None,)
        if not isinstance(value, float):
            return None
        if any(not isinstance(getattr(norm, "weight", None), torch.Tensor) or _hooked(norm) for norm in norms):
            return None
        linears = [(layer.q, layer.k, layer.v, layer.o, layer.gate, layer.up, layer.down) for layer in layers]
        return LayerWeights(
            [norm.weight for norm in norms], [w for layer in linears for w, _ in layer],
            [b for layer in linears for _, b in layer], value,
        )  # fmt: skip

    def layers_in_one_call(self, kernels: Kernels) -> bool:
        """Whether ``kernels.layers`` runs this model's layer loop: the model's layers fit it, and a probe
        (the first layer over a three-node tree of random rows after five committed slots, both ways)
        gave bitwise the hidden states and cache contents of the loop written out in
        :meth:`forward_rows` with the same kernels. Probed once per runner and op: a model whose norm,
        rotary or activation is not the one the op writes out (or a hub kernel swapped in for it)
        keeps the Python loop, with the same results either way."""
        if kernels.layers is None or self._parts(kernels)[1] is None:
            return False
        if kernels.attention_segments is None or kernels.write_segments is None:
            return False
        # a model moved or cast is probed again
        key = (id(kernels.layers), kernels.blocks, self.head[0].dtype, self.head[0].device)
        known = self._probed.get(key)
        if known is None:
            known = self._probe(kernels)
            self._probed[key] = known
        return known

    def _probe(self, kernels: Kernels) -> bool:
        layers, layer_weights, _ = self._parts(kernels)
        assert kernels.layers is not None and layer_weights is not None
        weight = self.head[0]
        generator = torch.Generator().manual_seed(1)
        rows, start = 3, 5
        with torch.inference_mode():
            hidden = torch.randn(1, rows, self.embed.embedding_dim, generator=generator).to(weight)
            positions = torch.arange(start, start + rows, device=weight.device)[None]
            cos, sin = self.rotary(hidden, positions)
            ancestors = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool, device=weight.device)
            committed = torch.randn(2, 1, self.kv_heads, 8, self.head_dim, generator=generator).to(weight)
            caches = []
            for _ in range(2):
                cache = StaticKVCache(1, 8, weight.device)
                cache.ensure(0, committed[0], committed[1])
                keys, values = cache.layer(0)
                keys.copy_(committed[0])
                values.copy_(committed[1])
                caches.append(cache)
            segment = Segment(torch.zeros((1, rows), dtype=torch.long), positions, caches[0], start, ancestors)
            looped = self._layers_looped(hidden, cos, sin, [segment], kernels, layers[:1])
            first = LayerWeights(
                layer_weights.norms[:2], layer_weights.weights[:7], layer_weights.biases[:7], layer_weights.eps
            )
            fused = kernels.layers(
                hidden, cos, sin, first, (self.query_heads, self.kv_heads), self.rotary_together, self.scaling,
                [[caches[1].layer(0)]], [start], [rows], [ancestors],
            )  # fmt: skip
        same_cache = all(torch.equal(a, b) for a, b in zip(caches[0].layer(0), caches[1].layer(0), strict=True))
        return looped.shape == fused.shape and torch.equal(looped, fused) and same_cache

    def _rotary_works_on_heads_together(self, model: Any) -> bool:
        """Whether the model's rotary function gives the same bits on the query and key heads side by side
        (one call over ``[1, Hq + Hkv, R, D]``) as on each apart: then a forward rotates both in one call,
        half the small operations. Checked on random values at construction, so a model whose rotary
        treats queries and keys differently keeps two calls."""
        parameter = next(model.parameters())
        generator = torch.Generator().manual_seed(0)
        rows = 3
        hidden = torch.randn(1, rows, self.embed.embedding_dim, generator=generator).to(parameter)
        with torch.inference_mode():
            cos, sin = self.rotary(hidden, torch.arange(rows, device=parameter.device)[None])
            shape = (1, rows, self.head_dim)
            query = torch.randn(1, self.query_heads, *shape[1:], generator=generator).to(parameter)
            key = torch.randn(1, self.kv_heads, *shape[1:], generator=generator).to(parameter)
            apart = self.apply_rotary(query, key, cos, sin)
            both, _ = self.apply_rotary(torch.cat([query, key], dim=1), key[:, :0], cos, sin)
        together = (both[:, : self.query_heads], both[:, self.query_heads :])
        return all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(apart, together, strict=True))

    def forward(self, segments: Sequence[Segment], kernels: Kernels) -> list[torch.Tensor]:
        """Logits for every segment: ``[T_s, V]`` each (``[1, V]`` with ``last_only``): :meth:`forward_rows`, split."""
        logits = self.forward_rows(segments, kernels)
        if len(segments) == 1:  # a lone sequence's (every plain step's): no split to make
            return [logits]
        return list(torch.split(logits, [1 if s.last_only else s.tokens.shape[1] for s in segments]))

    def forward_rows(self, segments: Sequence[Segment], kernels: Kernels) -> torch.Tensor:
        """Logits of every segment's rows, segment after segment: ``[R', V]`` (a ``last_only`` segment: one row).

        All segments' rows go through each linear layer together (one weight pass for the
        whole batch: ``R = sum T_s`` rows); attention runs per segment over its own cache.
        """
        logits: torch.Tensor = self._rows(segments, kernels, features=False)
        return logits

    def forward_features(self, segment: Segment, kernels: Kernels) -> tuple[torch.Tensor, torch.Tensor]:
        """One segment's logits (as :meth:`forward`) and the features of all its rows ``[T, E]`` (after the
        final norm: the LM head's input). The logits are bitwise :meth:`forward`'s: the same operations."""
        logits, features = self._rows([segment], kernels, features=True)
        return logits, features

    def _rows(self, segments: Sequence[Segment], kernels: Kernels, features: bool) -> Any:
        rows = [segment.tokens.shape[1] for segment in segments]
        if len(segments) == 1:  # a lone sequence's: its own tensors (a concatenation would copy them)
            tokens, positions = segments[0].tokens, segments[0].positions  # [1, R] each
        else:
            tokens = torch.cat([segment.tokens for segment in segments], dim=1)  # [1, R]
            positions = torch.cat([segment.positions for segment in segments], dim=1)  # [1, R]
        hidden = self.embed(tokens)  # [1, R, E]
        cos, sin = self.rotary(hidden, positions)  # [1, R, D] each
        layers, layer_weights, head = self._parts(kernels)
        if all(segment.cache.allocated for segment in segments) and self.layers_in_one_call(kernels):
            assert kernels.layers is not None and layer_weights is not None
            caches = [[segment.cache.layer(index) for segment in segments] for index in range(self.num_layers)]
            hidden = kernels.layers(
                hidden, cos, sin, layer_weights, (self.query_heads, self.kv_heads), self.rotary_together,
                self.scaling, caches, [segment.start for segment in segments], rows,
                [segment.ancestors for segment in segments],
            )  # fmt: skip
        else:
            hidden = self._layers_looped(hidden, cos, sin, segments, kernels, layers)
        if features:  # every row's features (after the final norm), the logits of the rows wanted only
            normed = self.final_norm(hidden)[0]  # [R, E]
            wanted = torch.cat([normed[first : first + count] for first, count in _kept(segments, rows)])
            return kernels.linear(wanted, *head), normed
        if all(not segment.last_only for segment in segments):
            hidden = self.final_norm(hidden)[0]
        else:
            hidden = self.final_norm(torch.cat([hidden[0, first : first + count]
                                                for first, count in _kept(segments, rows)]))  # fmt: skip
        logits: torch.Tensor = kernels.linear(hidden, *head)  # [R', V]
        return logits

    def _layers_looped(
        self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segments: Sequence[Segment],
        kernels: Kernels, layers: Sequence[_Layer],
    ) -> torch.Tensor:  # fmt: skip
        """``hidden`` ``[1, R, E]`` through ``layers`` (from layer 0), op by op in Python."""
        linear = kernels.linear
        masks = [None if kernels.attention is not None else segment.mask() for segment in segments]
        rows = [segment.tokens.shape[1] for segment in segments]
        total = sum(rows)
        shape = (1, total, -1, self.head_dim)
        grouped = self.kv_heads != self.query_heads
        batched = kernels.attention_segments is not None and kernels.write_segments is not None and len(segments) > 1
        starts = [segment.start for segment in segments]
        for index, layer in enumerate(layers):
            residual = hidden
            x = layer.input_norm(hidden)
            query, key, value = (y.view(shape) for y in kernels.group(x, layer.q, layer.k, layer.v))
            if layer.q_norm is not None:
                query, key = layer.q_norm(query), layer.k_norm(key)
            query, key, value = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)  # [1, H, R, D]
            if self.rotary_together:  # one call over the query and key heads side by side: the same bits
                both, _ = self.apply_rotary(torch.cat([query, key], dim=1), key[:, :0], cos, sin)
                query, key = both[:, : self.query_heads], both[:, self.query_heads :]
            else:
                query, key = self.apply_rotary(query, key, cos, sin)
            outputs = []
            if batched:  # every segment's cache written, then attended, in one call each
                assert kernels.attention_segments is not None and kernels.write_segments is not None
                caches = [segment.cache.ensure(index, key, value) for segment in segments]
                kernels.write_segments(key, value, caches, starts, rows)
                together = [(keys, values, start, count, segment.ancestors) for (keys, values), start, count, segment
                            in zip(caches, starts, rows, segments, strict=True)]  # fmt: skip
                outputs.append(kernels.attention_segments(query, together, self.scaling))  # [1, R, Hq * D]
            else:
                offset = 0
                for segment, mask, count in zip(segments, masks, rows, strict=True):
                    part = slice(offset, offset + count)
                    offset += count
                    width = segment.start + count
                    keys, values = segment.cache.ensure(index, key[:, :, part], value[:, :, part])  # [1, Hkv, S, D]
                    keys[:, :, segment.start : width] = key[:, :, part]
                    values[:, :, segment.start : width] = value[:, :, part]
                    if kernels.attention is not None:
                        attended = kernels.attention(
                            query[:, :, part], keys, values, segment.start, segment.ancestors, self.scaling
                        )
                        outputs.append(attended)  # [1, T_s, Hq * D]
                        continue
                    attended = F.scaled_dot_product_attention(
                        query[:, :, part], keys[:, :, :width], values[:, :, :width], attn_mask=mask,
                        scale=self.scaling, is_causal=mask is None and count > 1,  # count > 1: start 0
                        enable_gqa=grouped,
                    )  # fmt: skip
                    outputs.append(attended.transpose(1, 2).reshape(1, count, -1))  # [1, T_s, Hq * D]
            attended = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)
            hidden = residual + linear(attended, *layer.o)
            residual = hidden
            x = layer.post_norm(hidden)
            gate, up = kernels.group(x, layer.gate, layer.up)
            hidden = residual + linear(layer.act(gate) * up, *layer.down)
        return hidden


def _kept(segments: Sequence[Segment], rows: Sequence[int]) -> list[tuple[int, int]]:
    """``(first row, count)`` of the rows whose logits are wanted: all of a segment's, or its last."""
    keep, offset = [], 0
    for segment, count in zip(segments, rows, strict=True):
        keep.append((offset + count - 1, 1) if segment.last_only else (offset, count))
        offset += count
    return keep


def _hooked(module: Any) -> bool:
    """Whether calling ``module`` runs more than its class's ``forward`` (hooks, a patched forward)."""
    hooks = ("_forward_hooks", "_forward_pre_hooks")
    return "forward" in module.__dict__ or any(getattr(module, name, None) for name in hooks)


def aten_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``torch.nn.functional.linear``: the model's own kernel."""
    return F.linear(x, weight, bias)


PLAIN = Kernels(aten_linear)  # the model's own kernels: linear and SDPA

__all__: Sequence[str] = (
    "ARCHITECTURES", "PLAIN", "DecoderRunner", "Kernels", "Segment", "aten_linear", "unsupported_reason",
)  # fmt: skip
