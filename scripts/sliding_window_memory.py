"""KV memory of sliding-window models after a generation of 8 windows: specdec's dynamic cache against
``model.generate``'s own cache, and the mean accepted tokens per step (MAT) on a text that repeats
itself (``X + G + X``, ``G`` the model's own continuation of ``X``).

Random-weight models (no download): the tiny fp64 ones of tests/tiny_models.py (window 8), and a
Gemma-3-shaped fp32 one (``--shape gemma3``: 6 layers, 5 sliding : 1 full, window 64, head dim 64).
Memory is the bytes of the storages the cache's key and value tensors hold (a trimmed layer is a view,
so its storage can be larger than its tokens: that is what the process holds), sliding and full layers
apart. Run: ``PYTHONPATH=. python scripts/sliding_window_memory.py [--shape tiny|gemma3] [--drafter pld]``.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

import torch

import specdec
from specdec.backends.verifier import ModelVerifier


def _gemma3(window: int) -> Any:
    from transformers import AutoModelForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(vocab_size=4096, hidden_size=256, intermediate_size=1024, num_hidden_layers=6,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=64, sliding_window=window,
                              sliding_window_pattern=6, max_position_embeddings=8192)  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def _bytes(cache: Any) -> tuple[int, int, int, int]:
    """(sliding bytes, sliding tokens per layer, full bytes, full tokens per layer) of a cache's storages."""
    from transformers.cache_utils import DynamicSlidingWindowLayer

    sizes = {True: [0, 0], False: [0, 0]}
    for layer in cache.layers:
        sliding = isinstance(layer, DynamicSlidingWindowLayer)
        sizes[sliding][0] += sum(t.untyped_storage().nbytes() for t in (layer.keys, layer.values))
        sizes[sliding][1] = int(layer.keys.shape[-2])
    return sizes[True][0], sizes[True][1], sizes[False][0], sizes[False][1]


def measure(model: Any, window: int, drafter: str, vocab: int) -> None:
    text = [random.Random(6).randrange(2, vocab) for _ in range(4 * window)]
    steps = 8 * window
    ids = torch.tensor([text])
    continuation = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps, do_sample=False)
    text = text + continuation[0, len(text) :].tolist() + text  # X + G + X: the model continues with G again
    ids = torch.tensor([text])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps, do_sample=False,
                         return_dict_in_generate=True)  # fmt: skip
    theirs = _bytes(out.past_key_values)
    kept: list[Any] = []
    release = ModelVerifier.release

    def keep(self: ModelVerifier, state: Any) -> None:
        kept.append(state.cache)
        release(self, state)

    ModelVerifier.release = keep  # type: ignore[method-assign]
    try:
        result = specdec.run(model, text, drafter, max_new_tokens=steps, budget="full", engine="hf")
    finally:
        ModelVerifier.release = release  # type: ignore[method-assign]
    ours = _bytes(kept[-1])
    same = result.tokens == out.sequences[0, len(text) :].tolist()
    print(f"  {model.config.model_type}: window {window}, prompt {len(text)}, {steps} new tokens; identical: {same}; "
          f"{drafter} MAT {result.stats.mat:.2f}")  # fmt: skip
    print(f"    generate: sliding layers {theirs[0]:,} B ({theirs[1]} tokens each), full {theirs[2]:,} B "
          f"({theirs[3]} tokens each)")  # fmt: skip
    print(f"    specdec:  sliding layers {ours[0]:,} B ({ours[1]} tokens each), full {ours[2]:,} B "
          f"({ours[3]} tokens each)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=("tiny", "gemma3"), default="tiny")
    parser.add_argument("--drafter", default="pld")
    args = parser.parse_args()
    if args.shape == "gemma3":
        measure(_gemma3(64), 64, args.drafter, 4096)
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from tiny_models import VOCAB, WINDOW, tiny_model

    for arch, attn in (("mistral-swa", "sdpa"), ("gemma2", "eager"), ("gemma3_text", "sdpa"), ("gpt_oss", "eager")):
        measure(tiny_model(arch, attn), WINDOW, args.drafter, VOCAB)


if __name__ == "__main__":
    main()
