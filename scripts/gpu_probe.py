"""Two questions the H200 lease of 2026-11-27 left open, on a random model of the default model's shape
(no weights to carry: one device call).

    PYTHONPATH=. OUT=DIR python scripts/gpu_probe.py [cuda|cpu]

1. **Why a one-off ``run`` verifies slower than a warmed Generator.** On the H200 a ``run:none`` step
   took 10.0 ms against a Generator's 4.5 (both ``engine="graphs"``, the default model in fp32,
   docs/bench/gpu-h200-2026-11-27), steadily, not at the call's start. Here: a Generator's calls
   and three ``run`` calls, each with its ms per step and what its verifier did (eager forwards,
   captures and replays counted by patching :class:`specdec.backends.bucket_runner.BucketRunner`), whether
   it took a lent device state, its cache's capacity and the widths its graphs were captured at.
   The likely cause, found on the CPU since (an emulation of the graph pool, tests/test_graph_tiers.py):
   the first drafting ``run`` calibrates the budget on its own verifier, whose cache grows to 2,048
   slots, and every later ``run`` takes that device state from the model's pool, where graphs
   attended over the whole cache; graph widths now come in tiers. Part 1 starts with such a run.
2. **What a batch on the static cache gets now** (``specdec.backends.static_rows``: every row in one
   forward, new since that lease): ``none`` at B = 1, 4, 16, 32 against Hugging Face's batched
   ``generate`` on the same prompts, tokens/s.
3. **Why captures fail after Hugging Face's compiled static ``generate``.** In that lease, after
   ``hf-static`` (``torch.compile``, reduce-overhead: inductor's own CUDA graphs) ran in the process,
   every capture of specdec's failed ("operation failed due to a previous error during capture")
   and fell back to eager forwards. Here: the compiled ``generate``, then a Generator with the
   default ``capture_error_mode`` ("global": an unsafe call from any thread breaks the capture),
   then one with "thread_local"; each one's fallback reason.

Prints as it goes and writes ``$OUT/probe.json``. ``cpu`` is a smoke run (2 layers, part 1 only,
``engine="buckets"``). Nothing here is a test: it reports what it saw.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_random_shape import DEVICE, QUICK, shaped_model

import specdec
from specdec.backends import bucket_runner, static, static_shared

ENGINE = "buckets" if QUICK else "graphs"
NEW_TOKENS = 16 if QUICK else 64
COUNTS: Counter[str] = Counter()


def counted(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        COUNTS[name] += 1
        return method(*args, **kwargs)

    return wrapper


bucket_runner.BucketRunner.eager = counted("eager", bucket_runner.BucketRunner.eager)  # type: ignore[method-assign]
bucket_runner.BucketRunner._capture = counted("capture", bucket_runner.BucketRunner._capture)  # type: ignore[method-assign]
bucket_runner.BucketRunner.run = counted("run", bucket_runner.BucketRunner.run)  # type: ignore[method-assign]


def describe(verifier: Any) -> dict[str, Any]:
    held = verifier._held
    return {
        "held": None if held is None else id(held),
        "capacity": None if held is None else held.cache.capacity,
        "fallback": verifier.fallback_reason,
        "runners": {} if held is None else {
            size: f"{runner.mode} graphs at widths {list(runner.captured_widths)}"
            for size, runner in sorted(held.runners.items())
        },
    }


def call(label: str, go: Callable[[], tuple[Any, dict[str, Any]]]) -> dict[str, Any]:
    """Time ``go()`` (which returns the result and its verifier's :func:`describe`) and count what it ran."""
    COUNTS.clear()
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    result, verifier = go()
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    steps = result.stats.steps
    verify = sum(record.verify_s for record in result.stats.records)
    row = {"call": label, "seconds": round(seconds, 4), "steps": steps,
           "verify_ms_per_step": round(1000 * verify / max(steps, 1), 3), "counts": dict(COUNTS), **verifier}
    print(json.dumps(row), flush=True)
    return row


def described_run(model: Any, prompt: list[int]) -> tuple[Any, dict[str, Any]]:
    """``specdec.run`` with its verifier described as it closes (``run`` closes its Generator)."""
    seen: list[dict[str, Any]] = []
    original = static.StaticVerifier.close

    def close(self: Any) -> None:
        if self._held is not None:
            seen.append(describe(self))
        original(self)

    static.StaticVerifier.close = close  # type: ignore[method-assign]
    try:
        result = specdec.run(model, prompt, "none", engine=ENGINE, max_new_tokens=NEW_TOKENS)
    finally:
        static.StaticVerifier.close = original  # type: ignore[method-assign]
    return result, seen[0] if seen else {}


def part_one(model: Any, prompt: list[int]) -> list[dict[str, Any]]:
    rows = []
    # First a drafting run, as the one-off bench's first call: its first draft calibrates the budget on the
    # run's own verifier, whose cache grows to 2,048 slots for it and goes to the model's pool for every later
    # run (lease 2026-11-27: runs verified at 10 ms a step, the Generator at 4.5; graph widths now come in tiers).
    rows.append(call("calibrating run", lambda: (specdec.run(model, prompt, "sam+recycling", engine=ENGINE,
                                                              max_new_tokens=NEW_TOKENS), {})))
    generator = specdec.Generator(model, drafter="none", engine=ENGINE)
    generator.generate(prompt[:8], max_new_tokens=8)
    for index in range(2):
        rows.append(call(f"generator {index}", lambda: (generator.generate(prompt, max_new_tokens=NEW_TOKENS),
                                                         describe(generator.verifier))))
    for index in range(3):
        rows.append(call(f"run {index}", lambda: described_run(model, prompt)))
    rows.append({"idle_states": static_shared.idle_count(model)})
    return rows


def part_two(model: Any, prompt: list[int]) -> list[dict[str, Any]]:
    from transformers import CompileConfig

    rows: list[dict[str, Any]] = []
    ids = torch.tensor([prompt], device=DEVICE)
    for _ in range(2):
        model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=16,
                       cache_implementation="static", compile_config=CompileConfig())
    print("hf-static generate compiled and run twice", flush=True)
    original = torch.cuda.graph
    for error_mode in ("global", "thread_local"):
        static_shared.forget(model)  # no memory of an earlier failure

        def graph(*args: Any, mode: str = error_mode, **kwargs: Any) -> Any:
            kwargs.setdefault("capture_error_mode", mode)
            return original(*args, **kwargs)

        torch.cuda.graph = graph  # type: ignore[assignment,misc]
        try:
            generator = specdec.Generator(model, drafter="none", engine=ENGINE)
            row = call(f"after hf-static, capture_error_mode={error_mode}",
                       lambda g=generator: (g.generate(prompt, max_new_tokens=NEW_TOKENS), describe(g.verifier)))
            rows.append(row)
            generator.close()
        except Exception as error:  # report, go on to the next mode
            rows.append({"call": error_mode, "error": f"{type(error).__name__}: {error}"})
            print(rows[-1], flush=True)
        finally:
            torch.cuda.graph = original  # type: ignore[misc]
    return rows


def part_three(model: Any, prompt: list[int]) -> list[dict[str, Any]]:
    """Batches on the static cache, every row in one forward (``static_rows``), against Hugging Face's batched
    ``generate`` on the same prompts (rotations of one prompt: equal lengths, no padding): tokens/s by B."""
    rows: list[dict[str, Any]] = []
    prompts = [prompt[i:] + prompt[:i] for i in range(32)]
    for batch in (1, 4, 16, 32) if not QUICK else (1, 2):
        chosen = prompts[: max(batch, 8)]
        generator = specdec.Generator(model, drafter="none", engine=ENGINE)
        generator.generate_batch(chosen[:batch], batch_size=batch, max_new_tokens=8)  # captures its buckets
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        results = generator.generate_batch(chosen, batch_size=batch, max_new_tokens=NEW_TOKENS)
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        ours = time.perf_counter() - started
        tokens = sum(len(result.tokens) for result in results)
        verifier = generator._batch_verifier(batch)
        hf_tokens, started = 0, time.perf_counter()
        for first in range(0, len(chosen), batch):
            ids = torch.tensor(chosen[first : first + batch], device=DEVICE)
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW_TOKENS)
            hf_tokens += int(out.shape[0] * (out.shape[1] - ids.shape[1]))
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        hf = time.perf_counter() - started
        row = {"batch": batch, "prompts": len(chosen), "specdec_none_tok_s": round(tokens / ours, 1),
               "hf_batched_tok_s": round(hf_tokens / hf, 1), "verifier": type(verifier).__name__,
               **describe(verifier)}
        print(json.dumps(row), flush=True)
        rows.append(row)
        generator.close()
    return rows


def main() -> None:
    torch.manual_seed(0)
    model = shaped_model(torch.float32)
    prompt = [int(t) for t in torch.randint(100, 40000, (40,))] * 3
    report = {"device": torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu",
              "run_vs_generator": part_one(model, prompt)}
    report["batches"] = part_three(model, prompt)  # before part two: a compiled generate may break later captures
    if not QUICK:
        report["capture_after_hf_static"] = part_two(model, prompt)
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "probe.json"), "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=1)


if __name__ == "__main__":
    main()
