"""GGUF blocks as the weights of engine="specdec" (``specdec/backends/specdec_engine/gguf_blocks.py``).

Layers: the widening of every supported block type against gguf-py's own dequantizer, bit for bit,
on every kernel path (hypothesis over random blocks, NaN and subnormal scales included); products
with blocks against the float32 kernel on the dequantized weights, bitwise (``torch.equal``), at
every row count and path; a tiny llama written as a GGUF file (gguf's ``GGUFWriter``, every
supported type, a float16 weight that stays widened, tied and untied heads) loaded by transformers,
its blocks read and checked, its logits through the engine bitwise the widened model's and its
tokens identical end to end through ``specdec.run``; damaged files refused at load; the default
model's tokens identical both ways. Bad input to the ops: tests/test_cpu_kernels_bad_input.py.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specdec
from specdec import gguf_weights
from specdec.backends.specdec_engine import cpu_kernels, gguf_blocks
from specdec.errors import SpecDecError
from specdec.models import note_gguf_file

gguf = pytest.importorskip("gguf")
TYPES = tuple(cpu_kernels.GGUF_BLOCK_TYPES)


@pytest.fixture(scope="module")
def kernels() -> Any:
    from conftest import native_or_skip

    return native_or_skip("cpu_kernels", cpu_kernels.load)


def _isas() -> list[str]:
    return cpu_kernels.supported_isas() if cpu_kernels.available() else ["portable"]


def random_blocks(kind: str, rows: int, count: int, rng: np.random.Generator, scale: float = 0.0) -> np.ndarray:
    """Random blocks uint8 ``[rows, count, block_bytes]``; with ``scale`` > 0 their float16 scales are set to
    finite values around it (weights of a sane size), else left as random bytes (any half: NaN, inf,
    subnormals)."""
    _, size = cpu_kernels.GGUF_BLOCK_TYPES[kind]
    raw = rng.integers(0, 256, size=(rows, count, size), dtype=np.uint8)
    if scale > 0:
        for offset in gguf_weights.HALF_FIELDS[kind]:
            halves = (rng.uniform(0.5, 1.5, size=(rows, count)) * scale).astype(np.float16)
            raw[..., offset : offset + 2] = halves[..., None].view(np.uint8).reshape(rows, count, 2)
    return raw


def dequantized(raw: np.ndarray, kind: str) -> np.ndarray:
    """gguf-py's widening (what transformers loads) of blocks ``[rows, count, size]`` -> float32 ``[rows, K]``."""
    rows = raw.shape[0]
    elements, _ = cpu_kernels.GGUF_BLOCK_TYPES[kind]
    if rows == 0:  # gguf-py's reshapes do not take empty arrays
        return np.zeros((0, raw.shape[1] * elements), dtype=np.float32)
    with np.errstate(all="ignore"):
        values = gguf.quants.dequantize(raw.reshape(rows, raw.shape[1] * raw.shape[2]), gguf.GGMLQuantizationType[kind])
    out: np.ndarray = np.ascontiguousarray(values.reshape(rows, raw.shape[1] * elements), dtype=np.float32)
    return out


# -- the widening --------------------------------------------------------------------------------------

_SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@_SETTINGS
@given(kind=st.sampled_from(TYPES), rows=st.integers(0, 40), count=st.integers(1, 4), seed=st.integers(0, 2**32 - 1))
def test_widening_is_gguf_dequantize_bit_for_bit(kernels: Any, kind: str, rows: int, count: int, seed: int) -> None:
    del kernels
    raw = random_blocks(kind, rows, count, np.random.default_rng(seed))
    expected = dequantized(raw, kind).view(np.uint32)  # bits, NaN payloads included
    for isa in _isas():
        widened = cpu_kernels.gguf_widen(torch.from_numpy(raw), isa).numpy()
        assert widened.shape == expected.shape
        assert np.array_equal(widened.view(np.uint32), expected), (kind, isa)


def test_subnormal_and_signed_zero_scales_widen_exactly(kernels: Any) -> None:
    del kernels
    for kind in TYPES:
        raw = random_blocks(kind, 4, 2, np.random.default_rng(1))
        for offset in gguf_weights.HALF_FIELDS[kind]:
            for i, bits in enumerate((0x0001, 0x03FF, 0x8000, 0x8201)):  # subnormals, -0
                raw[i, :, offset : offset + 2] = np.array([bits], dtype=np.uint16).view(np.uint8)
        for isa in _isas():
            widened = cpu_kernels.gguf_widen(torch.from_numpy(raw), isa).numpy()
            assert np.array_equal(widened.view(np.uint32), dequantized(raw, kind).view(np.uint32)), (kind, isa)


# -- products ------------------------------------------------------------------------------------------


@_SETTINGS
@given(kind=st.sampled_from(TYPES), m=st.integers(0, 40), n=st.integers(1, 70), count=st.integers(1, 3),
       with_bias=st.booleans(), seed=st.integers(0, 2**32 - 1))  # fmt: skip
def test_a_product_with_blocks_is_the_float_product_bitwise(
    kernels: Any, kind: str, m: int, n: int, count: int, with_bias: bool, seed: int
) -> None:
    del kernels
    rng = np.random.default_rng(seed)
    raw = random_blocks(kind, n, count, rng, scale=1e-3)
    blocks, weight = torch.from_numpy(raw), torch.from_numpy(dequantized(raw, kind))
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(m, weight.shape[1], generator=generator)
    bias = torch.randn(n, generator=generator) if with_bias else None
    for isa in _isas():
        expected = cpu_kernels.skinny_linear(x, weight, bias, isa)
        assert torch.equal(cpu_kernels.skinny_linear(x, blocks, bias, isa), expected), (kind, m, n, isa)


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0", "Q4_1", "Q4_K"])
@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_a_row_group_with_an_infinite_or_nan_scale_is_the_float_product(kernels: Any, kind: str, m: int) -> None:
    """The streamed row groups (1-4 rows of x, 16 weight rows at a time: Q4_K's 1-3 included) widen 8 rows'
    scales in one conversion, but where one of them is inf or NaN (which a file's load check refuses, the op
    does not): each row's own widening then, the same values; the finite rows bitwise, NaN payloads too."""
    del kernels
    rng = np.random.default_rng(7)
    raw = random_blocks(kind, 32, 2, rng, scale=1e-3)
    offsets = gguf_weights.HALF_FIELDS[kind]
    raw[3, 1, offsets[0] : offsets[0] + 2] = np.array([0x00, 0x7C], dtype=np.uint8)  # d = +inf
    raw[20, 0, offsets[-1] : offsets[-1] + 2] = np.array([0x01, 0x7C], dtype=np.uint8)  # a signalling NaN
    blocks, weight = torch.from_numpy(raw), torch.from_numpy(dequantized(raw, kind))
    x = torch.randn(m, weight.shape[1], generator=torch.Generator().manual_seed(m))
    for isa in _isas():
        got, expected = cpu_kernels.skinny_linear(x, blocks, None, isa), cpu_kernels.skinny_linear(x, weight, None, isa)
        finite = expected.isfinite()
        assert not finite[:, [3, 20]].any() and finite.sum() == m * 30, (kind, isa)
        assert torch.equal(got[finite], expected[finite]), (kind, m, isa)  # the other rows bitwise
        assert torch.equal(got.view(torch.int32), expected.view(torch.int32)), (kind, isa)  # NaN payloads too


def test_a_group_mixing_types_and_dense_weights_is_each_product_alone(kernels: Any) -> None:
    del kernels
    rng = np.random.default_rng(3)
    raws = {kind: random_blocks(kind, 16 * (i + 1) + 3, 256 // cpu_kernels.GGUF_BLOCK_TYPES[kind][0], rng, 1e-3)
            for i, kind in enumerate(TYPES)}  # fmt: skip
    dense = torch.randn(24, 256)
    for rows in (1, 2, 3, 4, 7, 16, 33):
        x = torch.randn(1, rows, 256)
        for isa in _isas():
            layers = [(torch.from_numpy(raw), None) for raw in raws.values()] + [(dense, None)]
            together = cpu_kernels.skinny_linears(x, layers, isa)
            alone = [cpu_kernels.skinny_linear(x, torch.from_numpy(dequantized(raw, kind)), None, isa)
                     for kind, raw in raws.items()] + [cpu_kernels.skinny_linear(x, dense, None, isa)]  # fmt: skip
            assert all(torch.equal(a, b) for a, b in zip(together, alone, strict=True)), (rows, isa)


# -- a tiny llama as a GGUF file ---------------------------------------------------------------------------

HIDDEN, FFN, HEADS, KV_HEADS, LAYERS, VOCAB = 256, 512, 4, 2, 2, 320
# Each layer's weights' types (a file may mix them); "F16" stays widened (no block kernel for it).
LAYER_TYPES = (
    {"attn_q": "Q4_K", "attn_k": "Q6_K", "attn_v": "Q8_0", "attn_output": "Q4_0", "ffn_gate": "Q4_1",
     "ffn_up": "Q4_K", "ffn_down": "Q6_K"},
    {"attn_q": "Q4_1", "attn_k": "Q4_0", "attn_v": "Q4_1", "attn_output": "Q8_0", "ffn_gate": "Q6_K",
     "ffn_up": "F16", "ffn_down": "Q4_1"},
)  # fmt: skip


def write_tiny_gguf(path: Path, *, tied: bool, seed: int = 0) -> Path:
    """A random llama of :data:`LAYER_TYPES` as a GGUF file (gguf's writer): the file transformers loads."""
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(VOCAB)
    writer.add_rope_dimension_count(HIDDEN // HEADS)

    def quantized(name: str, kind: str, rows: int, cols: int) -> None:
        if kind == "F16":
            writer.add_tensor(name, (rng.standard_normal((rows, cols)) * 0.05).astype(np.float16))
            return
        elements, _ = cpu_kernels.GGUF_BLOCK_TYPES[kind]
        raw = random_blocks(kind, rows, cols // elements, rng, scale={"Q4_K": 1e-4, "Q6_K": 2e-5}.get(kind, 3e-3))
        writer.add_tensor(name, raw.reshape(rows, -1), raw_dtype=gguf.GGMLQuantizationType[kind])

    quantized("token_embd.weight", "Q8_0", VOCAB, HIDDEN)
    shapes = {"attn_q": (HIDDEN, HIDDEN), "attn_k": (HIDDEN // HEADS * KV_HEADS, HIDDEN),
              "attn_v": (HIDDEN // HEADS * KV_HEADS, HIDDEN), "attn_output": (HIDDEN, HIDDEN),
              "ffn_gate": (FFN, HIDDEN), "ffn_up": (FFN, HIDDEN), "ffn_down": (HIDDEN, FFN)}  # fmt: skip
    for layer, types in enumerate(LAYER_TYPES):
        writer.add_tensor(f"blk.{layer}.attn_norm.weight", (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))
        writer.add_tensor(f"blk.{layer}.ffn_norm.weight", (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))
        for short, kind in types.items():
            quantized(f"blk.{layer}.{short}.weight", kind, *shapes[short])
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    if not tied:
        quantized("output.weight", "Q6_K", VOCAB, HIDDEN)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def load_tiny(path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                 attn_implementation="sdpa", local_files_only=True)  # fmt: skip
    model.eval()
    note_gguf_file(model, path)
    return model


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def tiny(request: Any, tmp_path_factory: Any, kernels: Any) -> tuple[Path, Any]:
    del kernels
    path = write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", tied=request.param)
    return path, load_tiny(path)


def test_the_blocks_of_a_tiny_llama_widen_to_its_weights(tiny: tuple[Path, Any]) -> None:
    path, model = tiny
    with pytest.warns(RuntimeWarning, match="1 linear weights of tiny.gguf .* run widened: model.layers.1.mlp.up_proj"):
        weights = gguf_blocks.read_blocks(path, model)
    params = dict(model.named_parameters(remove_duplicate=False))
    assert weights.dense == ("model.layers.1.mlp.up_proj.weight (F16)",)
    assert len(weights.blocks) == 7 * LAYERS - 1 + 1
    for name, blocks in weights.blocks.items():
        assert torch.equal(cpu_kernels.gguf_widen(blocks), params[name].detach()), name
    assert weights.types["model.layers.0.self_attn.q_proj.weight"] == "Q4_K"
    assert weights.types["lm_head.weight"] == ("Q8_0" if model.config.tie_word_embeddings else "Q6_K")


def _forward(model: Any, blocks: bool) -> Any:
    from specdec.backends.forward import Target
    from specdec.backends.specdec_engine.forward import SpecdecForward

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(gguf_blocks.WEIGHTS_ENV, "blocks" if blocks else "dense")
        forward = SpecdecForward(Target.of(model))
    assert forward.blocks is blocks
    return forward


def prompt_then_tree_logits(forward: Any, kernels: Any) -> torch.Tensor:
    """``forward``'s runner with ``kernels`` on a fresh cache: the logits of a 7-token prompt, then of a 5-node
    tree of two branches after it (the same random tokens every call), rows in order."""
    from specdec.backends.slot_cache import StaticKVCache
    from specdec.backends.specdec_engine.model_runner import Segment

    tokens = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(0))
    ancestors = torch.ones(5, 5, dtype=torch.bool).tril()
    ancestors[3, 2] = ancestors[4, 2] = ancestors[4, 3] = False
    cache = StaticKVCache(LAYERS, 32, torch.device("cpu"))
    (first,) = forward.runner.forward([Segment(tokens[:, :7], torch.arange(7)[None], cache, 0)], kernels)
    tree = Segment(tokens[:, 7:], torch.tensor([[7, 8, 9, 9, 10]]), cache, 7, ancestors)
    (second,) = forward.runner.forward([tree], kernels)
    return torch.cat([first, second])


def test_a_tiny_llamas_logits_on_blocks_are_the_widened_models_bitwise(tiny: tuple[Path, Any]) -> None:
    from specdec.backends.specdec_engine.forward import CPU_WIDENED, _forced_kernels

    _, model = tiny
    on_blocks, on_floats = _forward(model, True), _forward(model, False)
    # the calibration may time the float32 weights beside the blocks ("cpu-widened": the same bits)
    assert CPU_WIDENED in on_blocks.kernel_variants(1) and CPU_WIDENED not in on_floats.kernel_variants(1)
    assert on_blocks._variant_kernels(CPU_WIDENED).blocks is False and on_blocks._variant_kernels("cpu").blocks
    with torch.inference_mode():
        for isa in _isas():
            logits = [prompt_then_tree_logits(forward, _forced_kernels(isa, blocks))
                      for forward, blocks in ((on_blocks, True), (on_floats, False))]  # fmt: skip
            assert torch.isfinite(logits[1]).all()
            assert torch.equal(logits[0], logits[1]), isa


@pytest.mark.parametrize("drafter", ["none", "pld", "recycling"])
def test_a_tiny_llamas_tokens_on_blocks_are_the_widened_models(
    tiny: tuple[Path, Any], drafter: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, model = tiny
    prompt = [int(t) for t in torch.randint(2, VOCAB, (24,), generator=torch.Generator().manual_seed(1))] * 2
    outputs = {}
    for choice in ("blocks", "dense"):
        monkeypatch.setenv(gguf_blocks.WEIGHTS_ENV, choice)
        result = specdec.run(model, prompt, drafter=drafter, engine="specdec", max_new_tokens=40)
        outputs[choice] = list(result.tokens)
    assert outputs["blocks"] == outputs["dense"]


# -- damaged files, changed models ---------------------------------------------------------------------------


def test_a_truncated_file_is_refused_at_load(tmp_path: Path, kernels: Any) -> None:
    del kernels
    path = write_tiny_gguf(tmp_path / "tiny.gguf", tied=False)
    model = load_tiny(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 4096])
    with pytest.raises(SpecDecError, match="tiny.gguf.*does not parse|truncated or damaged"):
        gguf_blocks.read_blocks(path, model)


def test_a_block_with_an_infinite_scale_is_refused_naming_it(tmp_path: Path, kernels: Any) -> None:
    del kernels
    path = write_tiny_gguf(tmp_path / "tiny.gguf", tied=True)
    model = load_tiny(path)
    reader = gguf.GGUFReader(path)
    (tensor,) = [t for t in reader.tensors if t.name == "blk.1.attn_v.weight"]  # Q4_1: 20-byte blocks
    offset = int(tensor.data_offset) + 3 * (HIDDEN // 32) * 20 + 2 * 20  # row 3, block 2: its d
    del reader, tensor
    data = bytearray(path.read_bytes())
    data[offset : offset + 2] = np.array([0x7C00], dtype=np.uint16).tobytes()  # +inf
    path.write_bytes(bytes(data))
    with pytest.raises(SpecDecError, match=r"'blk.1.attn_v.weight': block 2 of row 3 has a non-finite scale"):
        gguf_blocks.read_blocks(path, model)


def test_a_model_changed_after_loading_is_refused_naming_the_weight(tmp_path: Path, kernels: Any) -> None:
    del kernels
    path = write_tiny_gguf(tmp_path / "tiny.gguf", tied=True)
    model = load_tiny(path)
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[5, 7] += 1.0
    with pytest.raises(SpecDecError, match=r"model.layers.1.mlp.down_proj.weight' is not what GGUF tensor"):
        gguf_blocks.read_blocks(path, model)


def test_an_unknown_weights_choice_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(gguf_blocks.WEIGHTS_ENV, "sparse")
    with pytest.raises(SpecDecError, match="SPECDEC_GGUF_WEIGHTS='sparse': valid values are blocks, dense"):
        gguf_blocks.weights_choice()


# -- the default model -------------------------------------------------------------------------------------


@pytest.mark.parametrize("drafter", ["none", "sam+recycling"])
def test_the_default_models_tokens_on_blocks_are_the_widened_models(
    default_model: Any, drafter: str, monkeypatch: pytest.MonkeyPatch, kernels: Any
) -> None:
    del kernels
    model, tokenizer = default_model
    outputs = {}
    for choice in ("blocks", "dense"):
        monkeypatch.setenv(gguf_blocks.WEIGHTS_ENV, choice)
        generator = specdec.Generator(model, tokenizer, drafter=drafter, engine="specdec")
        assert generator.verifier.forward.blocks is (choice == "blocks")
        result = generator.generate("Write a Python function that checks whether a number is prime.",
                                    max_new_tokens=48)  # fmt: skip
        outputs[choice] = list(result.tokens)
    assert outputs["blocks"] == outputs["dense"]


def test_curves_time_cpu_on_one_thread_and_floor_the_blocks_bytes(tiny: tuple[Path, Any]) -> None:
    from specdec.bench.curves import markdown, measure

    _, model = tiny
    threads = torch.get_num_threads()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the file's one F16 weight runs widened (said once)
        report = measure(model, "blocks=specdec:kernels=cpu:gguf_weights=blocks", (1, 2), (8,), 1, cpu_time=True)
        weights = gguf_blocks.model_blocks(model)
    assert weights is not None
    assert torch.get_num_threads() == threads and report["threads"] == 1 and report["clock"] == "thread CPU time"
    # the floor reads the blocks and the weights they do not stand for, but the embedding (a row a token)
    covered = {id(t) for name, t in model.named_parameters(remove_duplicate=False) if name in weights.blocks}
    covered.add(id(model.get_input_embeddings().weight))
    rest = sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in covered)
    assert report["block_bytes"] == weights.nbytes + rest
    assert report["block_bytes"] < sum(p.numel() * p.element_size() for p in model.parameters())
    assert len(report["block_read_ms_per_round"]) == 2 and report["block_read_ms"] > 0
    text = markdown(report)
    assert "ms of thread CPU time, 1 thread(s)" in text and "Reading the GGUF file's blocks" in text
