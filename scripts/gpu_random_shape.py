"""The GPU side without the default model's weights: a random model of its shape (SmolLM2-135M's
Llama config, 30 layers), for a device machine that cannot take the 98 MB GGUF in one transfer.

    PYTHONPATH=. OUT=DIR python scripts/gpu_random_shape.py [cuda|cpu]

Per dtype (fp32, bf16): Hugging Face's greedy ``generate`` on three prompts with repeats in
them, then ``specdec.run`` twice per prompt and drafter (``none``, ``pld``, ``sam+recycling``,
the default cache: CUDA graphs on a GPU) and a warmed ``Generator`` on the same prompts (what
a one-off call pays beyond a warmed one), every output judged against ``generate``'s
(:func:`specdec.testing.compare_outputs`); ``run_batch`` at batch 4 against each row's plain
decoding; then verification ms by tree size (1-128 nodes, context 512) for the eager dynamic
cache against the CUDA-graph static cache (``specdec.bench.curves``). Prints as it goes and
writes ``$OUT/r1.json``. ``cpu`` is a quick smoke run (2 layers, ``engine="buckets"``). Measured on
an H200: docs/bench/gpu-h200-2026-11-26.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

import specdec
from specdec.bench.curves import markdown, measure
from specdec.testing import compare_outputs

DEVICE = sys.argv[1] if len(sys.argv) > 1 else "cuda"
QUICK = DEVICE == "cpu"
NEW_TOKENS = 16 if QUICK else 64
ENGINE = "buckets" if QUICK else "auto"
VARIANTS = ("dynamic=hf,graphs=graphs,"
            "graphs-torch=graphs:tree_ops=torch")


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def timed(call: Callable[[], Any]) -> tuple[Any, float]:
    sync()
    started = time.perf_counter()
    result = call()
    sync()
    return result, time.perf_counter() - started


def shaped_model(dtype: torch.dtype) -> Any:
    """SmolLM2-135M's shape with random weights, peaked enough that greedy rarely meets a tie."""
    config = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=2 if QUICK else 30,
                         num_attention_heads=9, num_key_value_heads=3, head_dim=64, vocab_size=49152,
                         max_position_embeddings=8192, rope_theta=100000.0, tie_word_embeddings=True,
                         rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    torch.manual_seed(0)
    with torch.device(DEVICE):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.06)
    return model


def hf_greedy(model: Any, prompt: list[int], count: int) -> tuple[list[int], float]:
    ids = torch.tensor([prompt], device=DEVICE)
    out, seconds = timed(lambda: model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=count,
                                                do_sample=False, eos_token_id=None, pad_token_id=2))
    return [int(t) for t in out[0, len(prompt):]], seconds


def one_offs(model: Any, prompts: list[list[int]], references: list[tuple[list[int], float]],
             drafter: str) -> dict[str, Any]:
    """Two ``run`` calls per prompt and a warmed Generator's, each judged against ``generate``."""
    rows = []
    for prompt, (reference, hf_s) in zip(prompts[:3], references, strict=True):
        def call(p: list[int] = prompt) -> Any:
            return specdec.run(model, p, drafter, max_new_tokens=NEW_TOKENS, engine=ENGINE, ignore_eos=True)

        first, first_s = timed(call)
        second, second_s = timed(call)
        comparison = compare_outputs(model, prompt, second.tokens, reference)
        rows.append({"hf_s": round(hf_s, 3), "run1_s": round(first_s, 3), "run2_s": round(second_s, 3),
                     "mat": round(second.stats.mat, 2), "same12": first.tokens == second.tokens,
                     "verdict": comparison.describe(), "ok": comparison.acceptable, "engine": second.stats.engine})
    generator = specdec.Generator(model, drafter=drafter, engine=ENGINE)
    generator.generate(prompts[3], max_new_tokens=NEW_TOKENS, ignore_eos=True)
    warmed = []
    for prompt in prompts[:3]:
        _, seconds = timed(lambda p=prompt: generator.generate(p, max_new_tokens=NEW_TOKENS, ignore_eos=True))
        warmed.append(round(seconds, 3))
    return {"rows": rows, "generator_s": warmed, "verifier": generator.verifier.name,
            "fallback": getattr(generator.verifier, "fallback_reason", None)}


def one_dtype(dtype: str, prompts: list[list[int]]) -> dict[str, Any]:
    """Everything the module docstring lists, for one dtype."""
    model = shaped_model(getattr(torch, dtype))
    record: dict[str, Any] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hf_greedy(model, prompts[3], 4)  # generate's own first call
        references = [hf_greedy(model, p, NEW_TOKENS) for p in prompts[:3]]
        for drafter in ("none", "pld", "sam+recycling"):
            record[drafter] = one_offs(model, prompts, references, drafter)
            print(dtype, drafter, json.dumps(record[drafter]), flush=True)
        plain = [specdec.run(model, p, "none", max_new_tokens=NEW_TOKENS, ignore_eos=True).tokens for p in prompts]
        for drafter in ("none", "sam+recycling"):
            results, seconds = timed(lambda d=drafter: specdec.run_batch(
                model, prompts, d, batch_size=4, max_new_tokens=NEW_TOKENS, ignore_eos=True))
            record[f"batch4/{drafter}"] = {"s": round(seconds, 3), "identical": [
                r.tokens == t for r, t in zip(results, plain, strict=True)]}
            print(dtype, "batch", drafter, record[f"batch4/{drafter}"], flush=True)
    record["warnings"] = sorted({f"{w.category.__name__}: {str(w.message)[:300]}" for w in caught})
    print(dtype, "warnings", json.dumps(record["warnings"], indent=1), flush=True)
    if not QUICK:
        curves = measure(model, VARIANTS, (1, 2, 4, 8, 16, 32, 64, 128), (512,), 3)
        record["curves"] = curves
        print(f"## default-model shape, random weights, {dtype}\n\n{markdown(curves)}\n", flush=True)
    return record


def main() -> None:
    rng = random.Random(1)
    base = [rng.randrange(100, 40000) for _ in range(40)]
    prompts = [base[i:] + base + base[: 20 + i] for i in range(4)]  # repeats: pld and sam draft something
    report: dict[str, Any] = {}
    for dtype in ["float32"] if QUICK else ["float32", "bfloat16"]:
        report[dtype] = one_dtype(dtype, prompts)
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "r1.json"), "w", encoding="utf-8") as file:
        json.dump(report, file, indent=1)


if __name__ == "__main__":
    main()
