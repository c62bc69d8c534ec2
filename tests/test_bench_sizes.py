"""``specdec bench sizes`` on a tiny shape: the checkpoint it writes loads, the curve and the modeled table come out
with their keys, a shape that cannot fit is reported, and the command line parses.

The shapes users run (1B to 8B) are only built on the meta device here (their sizes, no memory); the figures
measured are never compared with a threshold.
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_models import VOCAB, own_tiny_model

from specdec import model_memory
from specdec.backends import make_verifier
from specdec.bench import sizes
from specdec.bench.random_gguf import Shape
from specdec.bench.stream_replay import Stream
from specdec.commands import build_parser
from specdec.drafters import DrafterContext
from specdec.errors import SpecDecError

TINY = sizes.SizeShape("llama", Shape(hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, vocab=VOCAB, context=512))
SETTINGS = sizes.SizesSettings(dtype=torch.float32, variants="hf=hf,specdec=specdec:kernels=cpu", sizes=(1, 4, 8),
                               contexts=(32,), repeats=1)  # fmt: skip


def _streams() -> list[Stream]:
    """Three recorded-like outputs that repeat their prompt (pld and sam find drafts in them)."""
    rng = random.Random(3)
    text = [rng.randrange(2, VOCAB) for _ in range(24)]
    return [Stream(i, "kind", text[:12], (text * 3)[12 + i : 52 + i]) for i in range(3)]


def test_the_public_shapes_sizes_on_the_meta_device() -> None:
    """The 1B shape at the default tokenizer's vocabulary is the 1.07B weights measured before; the 8B one's
    bfloat16 bytes are what must fit; nothing is allocated (the meta device)."""
    parameters, weight_bytes = sizes.weights_of(sizes.SHAPES["llama-3.2-1b"])
    assert round(parameters / 1e9, 2) == 1.07 and weight_bytes == 2 * parameters
    big, big_bytes = sizes.weights_of(sizes.SHAPES["llama-3.1-8b"])
    assert 7e9 < big < 8e9 and big_bytes == 2 * big
    config = sizes.config_of(sizes.SHAPES["qwen2.5-1.5b"])
    assert config.model_type == "qwen2" and config.num_key_value_heads == 2 and config.vocab_size == sizes.VOCAB


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_checkpoint_is_written_layer_by_layer_and_loads(tmp_path: Path, dtype: torch.dtype) -> None:
    folder = sizes.write_checkpoint(TINY, tmp_path / "tiny", dtype)
    index = json.loads((folder / "model.safetensors.index.json").read_text(encoding="utf-8"))
    assert len(set(index["weight_map"].values())) == TINY.shape.layers + 1  # a shard per layer, one for the rest
    parameters, weight_bytes = sizes.weights_of(TINY, dtype)
    assert model_memory.checkpoint_bytes(folder, dtype) == weight_bytes == index["metadata"]["total_size"]
    model = sizes.load_checkpoint(folder, dtype)
    assert sum(p.numel() for p in model.parameters()) == parameters
    assert next(model.parameters()).dtype == dtype and model.config.num_hidden_layers == TINY.shape.layers
    spread = float(model.model.embed_tokens.weight.detach().float().std())
    assert torch.all(model.model.norm.weight == 1) and 0.01 < spread < 0.03
    again = sizes.write_checkpoint(TINY, tmp_path / "again", dtype)  # seeded: the same weights
    assert torch.equal(sizes.load_checkpoint(again, dtype).lm_head.weight, model.lm_head.weight)


def test_the_curve_and_the_modeled_table_come_out_with_their_keys(tmp_path: Path) -> None:
    context = DrafterContext(vocab_size=VOCAB)
    verifier = make_verifier(own_tiny_model("llama").float())  # the model the outputs are "recorded" from
    settings = dataclasses.replace(SETTINGS, cpu_time=True, folder=tmp_path / "checkpoints")
    assert sizes.needs_model(settings.drafters, context)
    report = sizes.measure({"tiny": TINY}, settings, _streams(), context, verifier, progress=False)
    entry = report["shapes"]["tiny"]
    assert entry["status"] == "measured" and Path(entry["checkpoint"], "config.json").is_file()
    curve = entry["curve"]
    assert set(curve["ms"]) == {"hf", "specdec"} and curve["sizes"] == [1, 4, 8] and curve["clock"] == "thread CPU time"
    assert {"weight_read_ms", "gemm_peak_gflops", "gflop_per_node"} <= set(curve)
    figures = entry["modeled"]
    assert list(figures) == ["none", "pld", "sam+recycling"]
    keys = {"mat", "nodes_per_step", "tokens", "steps", "decoded", "modeled_s", "modeled_tokens_per_s",
            "modeled_speedup_over_none", "modeled_speedup_over_hf"}  # fmt: skip
    assert all(set(f) == keys for f in figures.values())
    assert figures["none"]["modeled_speedup_over_none"] == 1.0 and figures["none"]["mat"] == 1.0
    assert figures["pld"]["decoded"] == "replay" and figures["sam+recycling"]["decoded"] == "model"
    assert all(f["modeled_tokens_per_s"] > 0 for f in figures.values())
    ratio = curve["ms"]["hf"]["32"][0] / curve["ms"]["specdec"]["32"][0]  # none over hf: the one-node forwards'
    assert figures["none"]["modeled_speedup_over_hf"] == pytest.approx(ratio, rel=0.02)
    table = sizes.write(report, str(tmp_path / "out"))
    assert "modeled speedup over none" in table and "| tiny  | sam+recycling |" in table and "floor" in table
    assert json.loads((tmp_path / "out" / "sizes.json").read_text(encoding="utf-8"))["shapes"]["tiny"]["modeled"]
    assert "## tiny" in (tmp_path / "out" / "sizes.md").read_text(encoding="utf-8")
    with pytest.raises(SpecDecError, match="learns from the model's predictions"):  # recycling needs the model
        sizes.modeled(curve, _streams(), context, "sam+recycling")


def test_a_shape_that_cannot_fit_is_reported_not_crashed_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, needed = sizes.weights_of(TINY, torch.float32)
    monkeypatch.setattr(model_memory, "available_memory", lambda device: needed)  # under WEIGHTS_SHARE of it
    settings = dataclasses.replace(SETTINGS, drafters="none,pld")
    report = sizes.measure({"tiny": TINY, "also": TINY}, settings, _streams(), DrafterContext(vocab_size=VOCAB),
                           progress=False)  # fmt: skip
    assert [e["status"] for e in report["shapes"].values()] == ["does not fit"] * 2
    assert "does not fit" in report["shapes"]["tiny"]["reason"] and "modeled" not in report["shapes"]["tiny"]
    table = sizes.markdown(report)
    assert "| tiny  |" in table and "does not fit" in table


def test_the_curve_prices_no_tree_below_a_smaller_one() -> None:
    curve: dict[str, Any] = {"sizes": [1, 4, 8], "contexts": [64], "ms": {"v": {"64": [10.0, 9.0, 12.0]}}}
    cost = sizes.cost_of(curve, "v")
    priced = cost.calibrated(torch.tensor([1, 4, 8, 16]).numpy(), 64) * 1e3
    assert list(priced.round(3)) == [10.0, 10.0, 12.0, 16.0]  # 4 raised to 1's; past 8 extrapolated upward
    with pytest.raises(SpecDecError, match="no variant 'hf'"):
        sizes.cost_of(curve, "hf")


def test_the_command_line_parses() -> None:
    args = build_parser().parse_args(["bench", "sizes", "--shapes", "llama-3.2-1b", "--cpu-time", "--repeats", "1",
                                      "--streams", "4", "--out", "runs/sizes"])  # fmt: skip
    assert args.func.__name__ == "cmd_sizes" and args.shapes == "llama-3.2-1b" and args.cpu_time
    assert (args.dtype, args.sizes, args.contexts, args.variants) == (
        "bfloat16", "1,4,8,16", "1024", "hf=hf,specdec=specdec:kernels=cpu")
    assert args.drafters == "none,pld,sam+recycling" and args.streams == 4 and args.price == "specdec"
    with pytest.raises(SpecDecError, match="unknown shape 'llama-70b'"):
        args.func(build_parser().parse_args(["bench", "sizes", "--shapes", "llama-70b"]))
    with pytest.raises(SpecDecError, match="variant 'torch'"):
        sizes.measure({}, sizes.SizesSettings(price="torch"), [], DrafterContext(vocab_size=VOCAB))
