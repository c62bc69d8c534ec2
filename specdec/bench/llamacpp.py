"""specdec beside llama.cpp on the same GGUF file: ``specdec bench llamacpp``.

Why: people who decode on a CPU decode GGUF files with llama.cpp, so a claim about speed on such a
file is a claim against llama.cpp's plain decoding of it, on the same machine, prompts and threads.
This module times, per held-out prompt (:func:`specdec.bench.oneoff.heldout_prompts`) and in turn
(arms interleaved, so a drift of the machine's speed reaches every arm alike):

- ``llama.cpp``: llama-cpp-python's ``Llama.generate`` on the same token ids (the Hugging Face
  tokenizer's chat template applied once, so both sides read the same prompt), greedy
  (``top_k=1``, ``temp=0``), its KV cache cleared before each prompt (no prefix reuse between
  prompts that share the chat template's opening);
- ``run:SPEC``: one ``specdec.run`` call per prompt with default arguments but the thread count,
  on the model transformers loads from the file (for ``engine="specdec"``, the file's quantized
  blocks: :mod:`specdec.backends.specdec_engine.gguf_blocks`);
- ``run:none, fp32 weights``: ``run:none`` on the dequantized float32 tensors instead of the blocks;
- ``hf``: ``model.generate`` greedy on the model transformers dequantized (the outputs' reference).

Each arm's seconds run from the call to the last new token (the prompt's prefill included, both
sides); tokens/s is new tokens over those seconds, and the speedups are ratios of the means over
prompts. Every specdec output is compared with ``hf``'s and with ``run:none``'s by
:func:`specdec.testing.compare_outputs` (identical, or first different at a judged near-tie), and
llama.cpp's outputs with ``hf``'s too: llama.cpp computes with its own kernels (and quantizes the
activations for its quantized products), so its tokens may differ from the dequantized model's,
which is reported, not judged. One untimed call of each arm on a prompt that is not measured comes
first (the extension built, the model's first forwards done).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from specdec.backends.specdec_engine.gguf_blocks import weights_chosen
from specdec.bench.methods import MethodSpec, parse_method, parse_methods
from specdec.bench.oneoff import WARM_PROMPT, Timing, heldout_prompts, hf_greedy, timed_run
from specdec.bench.report import markdown_table
from specdec.errors import SpecDecError
from specdec.models import encode_prompt
from specdec.testing import compare_outputs

LLAMA = "llama.cpp"
DENSE = "run:none, fp32 weights"

Arm = Callable[[Sequence[int], int], Timing]


def llamacpp_arm(gguf: Path, threads: int, context: int = 2048) -> Arm:
    """llama.cpp's plain greedy decoding of ``gguf`` (module docstring), as an arm."""
    try:
        Llama = importlib.import_module("llama_cpp").Llama  # optional: not among specdec's dependencies
    except ImportError as error:
        raise SpecDecError("specdec bench llamacpp needs llama-cpp-python (pip install llama-cpp-python); "
                           f"it did not import: {error}") from error
    llm = Llama(model_path=str(gguf), n_ctx=context, n_threads=threads, n_threads_batch=threads, verbose=False)
    eos = {int(llm.token_eos())}

    def arm(ids: Sequence[int], max_new_tokens: int) -> Timing:
        llm.reset()  # n_tokens = 0: generate then clears the whole KV cache instead of reusing a prefix
        tokens: list[int] = []
        started = time.perf_counter()
        for token in llm.generate(list(ids), top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
            tokens.append(int(token))
            if token in eos or len(tokens) >= max_new_tokens:
                break
        return Timing(tokens, time.perf_counter() - started)

    return arm


def specdec_arm(model: Any, tokenizer: Any, spec: MethodSpec) -> Arm:
    def arm(ids: Sequence[int], max_new_tokens: int) -> Timing:
        return timed_run(model, tokenizer, ids, spec, max_new_tokens)

    return arm


def dense_arm(model: Any, tokenizer: Any) -> Arm:
    """``run:none`` on the model's float32 tensors (``SPECDEC_GGUF_WEIGHTS=dense``), the blocks' reference."""
    spec = parse_method("none")

    def arm(ids: Sequence[int], max_new_tokens: int) -> Timing:
        with weights_chosen("dense"):
            return timed_run(model, tokenizer, ids, spec, max_new_tokens)

    return arm


def measure(model: Any, tokenizer: Any, gguf: Path, *, drafters: str = "none,sam+recycling", prompts: int = 12,
            max_new_tokens: int = 128, threads: int | None = None, progress: bool = True) -> dict[str, Any]:
    """Every arm on the first ``prompts`` held-out prompts, in turn (module docstring); JSON-ready results.
    torch's thread count is ``threads`` for the measurement and restored after it."""
    before = torch.get_num_threads()
    threads = threads or before
    torch.set_num_threads(threads)
    try:
        return _measure(model, tokenizer, gguf, drafters, prompts, max_new_tokens, threads, progress)
    finally:
        torch.set_num_threads(before)


def _measure(model: Any, tokenizer: Any, gguf: Path, drafters: str, prompts: int, max_new_tokens: int, threads: int,
             progress: bool) -> dict[str, Any]:
    arms: dict[str, Arm] = {LLAMA: llamacpp_arm(gguf, threads)}
    for spec in parse_methods([drafters]):
        arms[f"run:{spec.label}"] = specdec_arm(model, tokenizer, spec)
    arms[DENSE] = dense_arm(model, tokenizer)
    arms["hf"] = lambda ids, n: hf_greedy(model, ids, n)
    chosen = heldout_prompts()[:prompts]
    if len(chosen) < prompts:
        raise SpecDecError(f"--prompts {prompts}: specdec ships {len(chosen)} held-out prompts")
    for arm in arms.values():  # untimed: the first call of each arm
        arm(encode_prompt(tokenizer, WARM_PROMPT), 16)
    rows: list[dict[str, Any]] = []
    bar = tqdm(total=len(chosen) * len(arms), desc="llama.cpp vs specdec", disable=not progress)
    for prompt in chosen:
        ids = encode_prompt(tokenizer, prompt.text)
        timings: dict[str, Timing] = {}
        for name, arm in arms.items():
            bar.set_postfix_str(f"{prompt.kind}: {name}")
            timings[name] = arm(ids, max_new_tokens)
            bar.update()
        verdicts = {
            f"{name} vs {ref}": compare_outputs(model, ids, timings[name].tokens, timings[ref].tokens).describe()
            for name in timings if name not in ("hf", LLAMA)
            for ref in ("hf", "run:none") if ref in timings and ref != name
        }  # fmt: skip
        verdicts[f"{LLAMA} vs hf"] = _first_difference(timings[LLAMA].tokens, timings["hf"].tokens)
        rows.append({"kind": prompt.kind, "prompt_tokens": len(ids), "verdicts": verdicts,
                     "arms": {name: {"tokens": t.tokens, "seconds": round(t.seconds, 4), "steps": t.steps}
                              for name, t in timings.items()}})  # fmt: skip
    bar.close()
    return {"gguf": str(gguf), "threads": threads, "max_new_tokens": max_new_tokens, "prompts": rows,
            "summary": summary(rows)}  # fmt: skip


def _first_difference(ours: Sequence[int], theirs: Sequence[int]) -> str:
    if list(ours) == list(theirs):
        return "identical"
    index = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs)))
    return f"differs from token {index} ({len(ours)} vs {len(theirs)} tokens)"


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per arm: mean tokens/s over prompts, and its ratio to llama.cpp's and to ``hf``'s."""
    rates: dict[str, list[float]] = {}
    for row in rows:
        for name, arm in row["arms"].items():
            rates.setdefault(name, []).append(len(arm["tokens"]) / arm["seconds"] if arm["seconds"] > 0 else 0.0)
    means = {name: float(np.mean(values)) for name, values in rates.items()}
    return {name: {"tokens_per_s": round(mean, 2), "vs_llamacpp": round(mean / means[LLAMA], 3),
                   "vs_hf": round(mean / means["hf"], 3)} for name, mean in means.items()}  # fmt: skip


def report(results: dict[str, Any]) -> str:
    """The summary table and each prompt's verdicts, as markdown."""
    table = markdown_table(
        ["arm", "tokens/s", "x llama.cpp", "x hf"],
        [[name, s["tokens_per_s"], s["vs_llamacpp"], s["vs_hf"]] for name, s in results["summary"].items()],
    )
    verdicts: dict[str, list[str]] = {}
    for row in results["prompts"]:
        for pair, verdict in row["verdicts"].items():
            verdicts.setdefault(pair, []).append(verdict)
    lines = [f"{pair}: {sum(v == 'identical' for v in found)}/{len(found)} identical"
             + "".join(f"\n  - prompt {i}: {v}" for i, v in enumerate(found) if v != "identical")
             for pair, found in verdicts.items()]  # fmt: skip
    head = f"{results['gguf']}, {results['threads']} threads, up to {results['max_new_tokens']} new tokens"
    return head + "\n\n" + table + "\n\n" + "\n".join(lines) + "\n"
