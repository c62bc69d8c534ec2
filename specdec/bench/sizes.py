"""The sizes users run: verification curves of random-weight 1B, 3B and 8B shapes, and the modeled speedups on them.

Why: the default model is small (135M), and what speculation pays depends on how a verification's cost
grows with its tree, which is a property of the model's shape and the machine, not of trained weights.
So each shape is made here with random weights and measured, and the drafters' speedups on it are
**modeled**, never run: the tokens come from the default model's recorded greedy outputs.

**Shapes** (:data:`SHAPES`): the public configs' hidden size, MLP width, layers, query and key-value heads
and tied head of Llama-3.2-1B, Llama-3.2-3B, Llama-3.1-8B and Qwen2.5-1.5B, with the vocabulary cut to the
default tokenizer's 49,152 (the 1B shape then has 1.07B weights), so the default model's token ids run
on every shape. :func:`write_checkpoint` saves one as a safetensors checkpoint in ``dtype`` (bfloat16
by default) one decoder layer per shard, each drawn and written before the next is made (the model
itself is made on torch's ``meta`` device, which allocates nothing), so an 8B bfloat16 checkpoint (about
14 GB at this vocabulary) is written holding one layer, and loading it holds one copy. Before writing,
the weights' bytes are checked against the memory available (:func:`~specdec.model_memory.check_bytes_fit`)
and the disk's free space; before loading, the checkpoint's own headers are
(:func:`~specdec.model_memory.check_fits`). A shape that cannot fit is reported as such in the
tables, with the reason, and the other shapes are measured.

**Curves**: :func:`specdec.bench.curves.measure` on the loaded shape, by default Hugging Face's forward
(``hf``) beside ``engine="specdec"`` with specdec's CPU kernels (``specdec``) at 1, 4, 8 and 16 nodes
after 1,024 committed tokens, with the floors the curves report (the weights read once; the arithmetic
at torch's GEMM peak).

**The model** of the end-to-end speedup: every recorded output of the default model (by default the
54 greedy 128-token outputs in ``benchmarks/data/sam_streams``) is decoded again by each drafter with
:func:`~specdec.bench.stream_replay.replay_spec` (one drafter factory for them all, as a ``specdec
bench`` method runs: ``sam``'s store shared, recycling's matrix fresh per output), the budget planner
seeing the shape's measured curve of the ``price`` variant (``specdec``) as the cost of a verification
of each tree size: interpolated linearly between the measured sizes, extrapolated linearly past the
largest (the cost model's rule, :mod:`specdec.budget.cost_model`), a size measured cheaper than a
smaller one raised to it, and no per-step overhead (a spec's ``max_nodes=16`` keeps the trees within
the measured sizes). Each step is priced so: a drafter's modeled seconds are its steps' costs, its
modeled tokens/s its tokens over them; ``none`` is plain decoding on the same curve (its modeled
speedup is 1.0 by construction), and the ``baseline`` variant's (``hf``'s) one-node forward per
token is plain decoding with Hugging Face's forward. Drafters that need no model's predictions
(``pld``, ``sam``) are replayed over the recorded outputs, no model run; those that learn from them
(``recycling``, ``sam+recycling``) decode the recorded prompts on the default model itself, whose
forwards give their feedback but are not what is priced.

**What the model assumes**: that a draft's acceptance on a 1B, 3B or 8B model is what it is on the
default model, as a first approximation only. The drafters propose from the text (the prompt, the
output so far, earlier outputs, the model's own recent top tokens), and a larger model's greedy
text differs from the default model's: it may repeat its context more or less, so its acceptance
may be higher or lower. The modeled figures are the verification side of the answer, the shape's
costs, measured, with the default model's acceptance; the drafter's own time and the loop's, and any
time outside verification, are left out (a run measures them: ``specdec bench``, ``specdec bench oneoff``).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from specdec.bench.curves import floor_ms
from specdec.bench.curves import markdown as curves_markdown
from specdec.bench.curves import measure as measure_curves
from specdec.bench.methods import parse_methods
from specdec.bench.plot import grouped_bars, write_with_plot
from specdec.bench.random_gguf import Shape
from specdec.bench.report import markdown_table
from specdec.bench.results import load_results
from specdec.bench.stream_replay import Stream, recorded_streams, replay_spec
from specdec.budget import CostTable, VerifyCostModel
from specdec.errors import SpecDecError
from specdec.model_memory import check_bytes_fit, check_fits, size_text

DEFAULT_VARIANTS = "hf=hf,specdec=specdec:kernels=cpu"
DEFAULT_DRAFTERS = "none,pld,sam+recycling"
RUNS = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "sam_streams"
DEFAULT_RUNS = (RUNS / "heldout", RUNS / "spec_bench")  # the default model's greedy outputs (docs/algorithms/sam.md)
VOCAB = 49152  # the default tokenizer's vocabulary: every shape's, so its token ids run on each


@dataclass(frozen=True)
class SizeShape:
    """A model's shape: its family's config (``llama`` or ``qwen2``, with Qwen2's attention biases), the sizes
    (:class:`~specdec.bench.random_gguf.Shape`), a tied head or not, and the config's other fields."""

    family: str
    shape: Shape
    tied: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


# The public configs' shapes (config.json of each model on the Hugging Face Hub), the vocabulary cut to VOCAB.
SHAPES = {
    "llama-3.2-1b": SizeShape("llama", Shape(2048, 16, 32, 8, 8192, VOCAB), True, {"rope_theta": 500000.0}),
    "llama-3.2-3b": SizeShape("llama", Shape(3072, 28, 24, 8, 8192, VOCAB), True, {"rope_theta": 500000.0}),
    "llama-3.1-8b": SizeShape("llama", Shape(4096, 32, 32, 8, 14336, VOCAB), False, {"rope_theta": 500000.0}),
    "qwen2.5-1.5b": SizeShape("qwen2", Shape(1536, 28, 12, 2, 8960, VOCAB), True,
                              {"rope_theta": 1000000.0, "rms_norm_eps": 1e-6}),
}  # fmt: skip


def config_of(shape: SizeShape, dtype: torch.dtype = torch.bfloat16) -> Any:
    """The transformers config of ``shape``, its weights in ``dtype``."""
    from transformers import LlamaConfig, Qwen2Config

    kinds = {"llama": LlamaConfig, "qwen2": Qwen2Config}
    if shape.family not in kinds:
        raise SpecDecError(f"shape family {shape.family!r}: known are {', '.join(kinds)}")
    s = shape.shape
    config = kinds[shape.family](
        vocab_size=s.vocab, hidden_size=s.hidden, intermediate_size=s.ffn, num_hidden_layers=s.layers,
        num_attention_heads=s.heads, num_key_value_heads=s.kv_heads, max_position_embeddings=max(s.context, 8192),
        tie_word_embeddings=shape.tied, bos_token_id=1, eos_token_id=2, **shape.extra,
    )
    config.dtype = dtype
    return config


def _meta_model(shape: SizeShape, dtype: torch.dtype) -> Any:
    """The model of ``shape`` on torch's meta device: names and shapes, no memory."""
    from transformers import AutoModelForCausalLM

    auto: Any = AutoModelForCausalLM  # transformers' from_config is untyped
    with torch.device("meta"):
        return auto.from_config(config_of(shape, dtype), dtype=dtype)


def weights_of(shape: SizeShape, dtype: torch.dtype = torch.bfloat16) -> tuple[int, int]:
    """``(parameters, bytes)`` of ``shape``'s weights in ``dtype`` (a tied head counted once)."""
    count = sum(p.numel() for p in _meta_model(shape, dtype).parameters())
    return count, count * torch.empty((), dtype=dtype).element_size()


def write_checkpoint(shape: SizeShape, folder: Path, dtype: torch.dtype = torch.bfloat16, seed: int = 0,
                     tokenizer: Any = None) -> Path:  # fmt: skip
    """A random-weight checkpoint of ``shape`` in ``folder`` (made): ``config.json``, one safetensors shard per
    decoder layer (and one for the rest) with their index, and ``tokenizer``'s files where given. Linear
    weights and the embedding are normal with a spread of 0.02, norms ones, biases zeros; one shard's
    tensors are in memory at a time."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    model = _meta_model(shape, dtype)
    shards: dict[str, list[tuple[str, torch.Size]]] = {}
    for name, parameter in model.named_parameters():  # a tied head's weight once, as save_pretrained stores it
        parts = name.split(".")
        key = ".".join(parts[:3]) if parts[1:2] == ["layers"] else "rest"
        shards.setdefault(key, []).append((name, parameter.shape))
    generator = torch.Generator().manual_seed(seed)
    weight_map, total = {}, 0
    for index, tensors in enumerate(tqdm(shards.values(), desc=f"writing {folder.name}", unit="shard", leave=False), 1):
        file = f"model-{index:05d}-of-{len(shards):05d}.safetensors"
        drawn = {}
        for name, size in tensors:
            tensor = torch.empty(size, dtype=dtype)
            if name.endswith("norm.weight"):
                tensor.fill_(1.0)
            elif name.endswith(".bias"):
                tensor.zero_()
            else:
                tensor.normal_(0.0, 0.02, generator=generator)
            drawn[name] = tensor
            weight_map[name] = file
            total += tensor.numel() * tensor.element_size()
        save_file(drawn, str(folder / file), metadata={"format": "pt"})
        del drawn
    model.config.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    index_file = {"metadata": {"total_size": total}, "weight_map": weight_map}  # last: a complete checkpoint's mark
    (folder / "model.safetensors.index.json").write_text(json.dumps(index_file, indent=1) + "\n", encoding="utf-8")
    return folder


def load_checkpoint(folder: Path, dtype: torch.dtype, device: torch.device | None = None) -> Any:
    """The checkpoint in ``folder`` in ``dtype``, refused before any weight is read where it cannot fit
    (:func:`~specdec.model_memory.check_fits`)."""
    from transformers import AutoModelForCausalLM

    check_fits(folder, dtype, device)
    model: Any = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="sdpa",
                                                 local_files_only=True)  # fmt: skip
    model.eval()
    return model if device is None else model.to(device)


def cost_of(curve: dict[str, Any], variant: str) -> VerifyCostModel:
    """A frozen cost model of ``variant``'s measured curve: its ms by size at each measured context, each made
    the largest of its own and the smaller sizes' (a tree measured cheaper than a smaller one is the
    measurement's noise: it does more work), so no extrapolation past the largest size slopes down."""
    if variant not in curve["ms"]:
        raise SpecDecError(f"the curve has no variant {variant!r}; it has {', '.join(curve['ms'])}")
    rows = tuple(tuple(float(s) / 1e3 for s in np.maximum.accumulate(curve["ms"][variant][str(c)]))
                 for c in sorted(curve["contexts"]))  # fmt: skip
    table = CostTable(tuple(curve["sizes"]), tuple(sorted(curve["contexts"])), rows, {"device": variant})
    return VerifyCostModel(table, learn=False)


def modeled(curve: dict[str, Any], streams: Sequence[Stream], context: Any, drafters: str, price: str = "specdec",
            baseline: str = "hf", model: Any = None) -> dict[str, dict[str, Any]]:
    """Per drafter spec (comma-separated ``drafters``), the modeled figures on ``curve`` (module docstring):
    ``{"mat", "nodes_per_step", "tokens", "steps", "decoded", "modeled_s", "modeled_tokens_per_s",
    "modeled_speedup_over_none", "modeled_speedup_over_<baseline>"}``. ``model``: a verifier of the model
    that recorded ``streams``, for drafters that learn from its predictions (without one they are refused)."""
    cost, plain = cost_of(curve, price), cost_of(curve, baseline)
    figures = {}
    for spec in parse_methods([drafters]):
        rows = replay_spec(spec, streams, context, cost, "stream", model=model, baseline=plain)
        steps = max(1, sum(r["steps"] for r in rows))
        tokens = sum(r["emitted"] for r in rows)
        run_s = sum(r["run_s"] for r in rows)
        figures[spec.label] = {
            "mat": round(tokens / steps, 3), "nodes_per_step": round(sum(r["nodes"] for r in rows) / steps, 2),
            "tokens": tokens, "steps": steps, "decoded": rows[0]["decoded"] if rows else "replay",
            "modeled_s": round(run_s, 4), "modeled_tokens_per_s": round(tokens / run_s, 3),
            "modeled_speedup_over_none": round(sum(r["plain_s"] for r in rows) / run_s, 3),
            f"modeled_speedup_over_{baseline}": round(sum(r["baseline_s"] for r in rows) / run_s, 3),
        }  # fmt: skip
    return figures


def needs_model(drafters: str, context: Any) -> bool:
    """Whether a drafter of the specs learns from the model's predictions (feedback), which a replay lacks."""
    from specdec.drafters import make_factory

    return any(make_factory(spec.name, {}, context).create().feedback_topk for spec in parse_methods([drafters]))


def default_streams(runs: Sequence[Path] = DEFAULT_RUNS, limit: int | None = None) -> list[Stream]:
    """The recorded greedy outputs of the runs' references, in order; the first ``limit`` where given."""
    streams = [stream for run in runs for stream in recorded_streams(load_results(run))]
    return streams[:limit] if limit is not None else streams


@dataclass
class SizesSettings:
    """What :func:`measure` runs: the curves' settings, the drafters modeled and where checkpoints go."""

    dtype: torch.dtype = torch.bfloat16
    variants: str = DEFAULT_VARIANTS
    sizes: tuple[int, ...] = (1, 4, 8, 16)
    contexts: tuple[int, ...] = (1024,)
    repeats: int = 3
    cpu_time: bool = False
    drafters: str = DEFAULT_DRAFTERS
    price: str = "specdec"
    baseline: str = "hf"
    folder: Path | None = None  # None: a temporary folder per shape, removed once measured
    device: torch.device | None = None


def measure_shape(name: str, shape: SizeShape, settings: SizesSettings, tokenizer: Any = None) -> dict[str, Any]:
    """One shape's checkpoint (written, or reused from ``settings.folder``), its fit and its curve."""
    parameters, needed = weights_of(shape, settings.dtype)
    dtype_name = str(settings.dtype).removeprefix("torch.")
    entry: dict[str, Any] = {"family": shape.family, **dataclasses.asdict(shape.shape), "tied": shape.tied,
                             "parameters": parameters, "weight_bytes": needed}  # fmt: skip
    if settings.folder is None:
        folder = Path(tempfile.mkdtemp(prefix=f"specdec-{name}-"))
    else:
        folder = settings.folder / f"{name}-{dtype_name}"
        settings.folder.mkdir(parents=True, exist_ok=True)
    try:
        check_bytes_fit(needed, f"the {name} shape", f"in {dtype_name}", settings.device)
        if not (folder / "model.safetensors.index.json").is_file():
            free = shutil.disk_usage(folder if folder.exists() else folder.parent).free
            if needed > free:
                raise SpecDecError(f"the {name} shape does not fit the disk: {size_text(needed)} of weights, "
                                   f"{size_text(free)} free at {folder.parent}")  # fmt: skip
            write_checkpoint(shape, folder, settings.dtype, tokenizer=tokenizer)
        model = load_checkpoint(folder, settings.dtype, settings.device)
    except SpecDecError as error:
        if settings.folder is None:
            shutil.rmtree(folder, ignore_errors=True)
        return {**entry, "status": "does not fit", "reason": str(error)}
    try:
        curve = measure_curves(model, settings.variants, settings.sizes, settings.contexts, settings.repeats,
                               cpu_time=settings.cpu_time)  # fmt: skip
    finally:
        del model
        gc.collect()
        if settings.folder is None:
            shutil.rmtree(folder, ignore_errors=True)
    return {**entry, "status": "measured", "checkpoint": None if settings.folder is None else str(folder),
            "curve": curve}


def measure(shapes: dict[str, SizeShape], settings: SizesSettings, streams: Sequence[Stream], context: Any,
            model: Any = None, tokenizer: Any = None, progress: bool = True) -> dict[str, Any]:
    """Every shape's curve (:func:`measure_shape`), then its modeled figures (:func:`modeled`): the report.
    ``model``: a verifier of the model that recorded ``streams`` (for drafters that learn from it)."""
    labels = [spec.label for spec in parse_methods([settings.variants])]
    for variant in (settings.price, settings.baseline):
        if variant not in labels:  # before any checkpoint is written
            raise SpecDecError(f"variant {variant!r} (priced or the baseline) is not among {', '.join(labels)}")
    report: dict[str, Any] = {
        "dtype": str(settings.dtype).removeprefix("torch."), "variants": settings.variants,
        "sizes": list(settings.sizes), "contexts": list(settings.contexts), "repeats": settings.repeats,
        "clock": "thread CPU time" if settings.cpu_time else "wall", "drafters": settings.drafters,
        "price": settings.price, "baseline": settings.baseline, "streams": len(streams), "shapes": {},
    }
    for name, shape in tqdm(shapes.items(), desc="sizes", unit="shape", disable=not progress):
        entry = measure_shape(name, shape, settings, tokenizer)
        if entry["status"] == "measured":
            entry["modeled"] = modeled(entry["curve"], streams, context, settings.drafters, settings.price,
                                       settings.baseline, model)  # fmt: skip
        report["shapes"][name] = entry
    return report


def markdown(report: dict[str, Any]) -> str:
    """The shapes' curves (ms per verification, and the floor) and the modeled figures, one table each."""
    sizes, context = report["sizes"], max(report["contexts"])
    curve_rows, model_rows = [], []
    for name, entry in report["shapes"].items():
        weights = f"{entry['parameters'] / 1e9:.2f}B, {size_text(entry['weight_bytes'])}"
        if entry["status"] != "measured":
            curve_rows.append([name, weights, entry["status"], *["-"] * len(sizes)])
            model_rows.append([name, entry["status"], *["-"] * 5])
            continue
        curve = entry["curve"]
        for variant, by_context in curve["ms"].items():
            curve_rows.append([name, weights, variant, *[f"{ms:.1f}" for ms in by_context[str(context)]]])
        curve_rows.append([name, weights, "floor", *[f"{ms:.1f}" for ms in floor_ms(curve)]])
        for label, figures in entry["modeled"].items():
            model_rows.append([name, label, f"{figures['mat']:.2f}", f"{figures['nodes_per_step']:.1f}",
                               f"{figures['modeled_tokens_per_s']:.2f}",
                               f"{figures['modeled_speedup_over_none']:.2f}x",
                               f"{figures['modeled_speedup_over_' + report['baseline']]:.2f}x"])
    wall = report.get("clock", "wall") == "wall"
    unit = "ms" if wall else f"ms of {report['clock']} (the floor: wall clock)"
    text = (f"Verification cost, {unit}, by tree size at context {context} ({report['dtype']}; floor: "
            "max(weights read once, arithmetic at torch's GEMM peak)):\n\n"
            + markdown_table(["shape", "weights", "variant", *map(str, sizes)], curve_rows))
    text += (f"\n\nModeled, not run: the default model's {report['streams']} recorded greedy outputs decoded by "
             f"each drafter on the shape's {report['price']} curve (its acceptance assumed the default model's):\n\n"
             + markdown_table(["shape", "drafter", "MAT", "nodes/step", "modeled tokens/s", "modeled speedup over "
                               "none", f"modeled speedup over {report['baseline']}"], model_rows))
    for name, entry in report["shapes"].items():
        if entry["status"] != "measured":
            text += f"\n\n{name}: {entry['reason']}"
    return text


def write(report: dict[str, Any], out: str | None) -> str:
    """The tables; with ``out``, also ``sizes.json``, ``sizes.png`` (the modeled speedups) and ``sizes.md`` (the
    tables, then each measured shape's curves as ``specdec bench curves`` prints them) there."""
    text = markdown(report)
    if out is not None:
        details = [f"## {name}\n\n{curves_markdown(entry['curve'])}" for name, entry in report["shapes"].items()
                   if entry["status"] == "measured"]
        write_with_plot(report, "\n\n".join([text, *details]), out, "sizes", lambda plt: _draw(plt, report))
    return text


def _draw(plt: Any, report: dict[str, Any]) -> Any:
    """Modeled speedup over the baseline's plain decoding, one group per shape, one bar per drafter."""
    measured = {name: entry for name, entry in report["shapes"].items() if entry["status"] == "measured"}
    labels = list(dict.fromkeys(label for entry in measured.values() for label in entry["modeled"]))
    key = f"modeled_speedup_over_{report['baseline']}"
    figure, axes = plt.subplots(figsize=(max(6.0, 1.6 * len(measured) + 2), 4.0))
    series = {}
    for label in labels:
        values = [entry["modeled"][label][key] for entry in measured.values()]
        series[label] = (values, [f"{v:.2f}" for v in values])
    grouped_bars(axes, len(measured), series, baseline=f"{report['baseline']} plain decoding")
    axes.set_xticks(range(len(measured)), list(measured))
    axes.set_ylabel(f"modeled speedup over {report['baseline']}")
    axes.set_title(f"modeled, not run: {report['dtype']}, context {max(report['contexts'])}", fontsize=8)
    axes.legend(fontsize=7)
    return figure
