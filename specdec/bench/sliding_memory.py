"""KV memory of a sliding-window model after a generation of 8 windows: ``generate``'s cache against
specdec's on ``engine="hf"`` (sliding layers trimmed to the window plus a slack) and on the bucket
engines (sliding layers in rings of ``window - 1 +`` the largest bucket slots, full layers a static
cache of every token), each run checked identical to ``generate``.

Run by ``specdec bench sliding-memory`` (a few seconds on a CPU; docs/usage.md, "Supported models",
quotes its output). A random Gemma-3-shaped fp32 model: 6 layers, 5 sliding to
1 global, window 64, one KV head of 16; a 64-token prompt, then 8 windows + 1 new tokens, verified
in chains of 16 taken from ``generate``'s output.
"""

from __future__ import annotations

import random
from typing import Any

import torch
from transformers import AutoModelForCausalLM, Gemma3TextConfig

from specdec.backends.buckets.forward import BucketForward
from specdec.backends.forward import Target
from specdec.backends.verifier import ModelVerifier
from specdec.types import DraftTree

WINDOW = 64
PROMPT = 64
CHAIN = 16


def kv_bytes(layers: Any) -> int:
    """Bytes of the keys and values of ``layers`` (Hugging Face cache layers)."""
    return sum(layer.keys.nbytes + layer.values.nbytes for layer in layers)


def run_chains(verifier: Any, prompt: list[int], truth: list[int], steps: int) -> Any:
    """Verify ``truth``'s first ``steps`` tokens in chains of :data:`CHAIN`; the sequence's state."""
    state, pending, _ = verifier.prefill(prompt, reserve=steps + 1)
    done = 0
    while done < steps:
        depth = min(CHAIN, steps - done)
        result = verifier.verify(state, DraftTree.chain(pending, truth[done + 1 : done + depth]))
        if list(result.accepted_tokens) != truth[done : done + depth]:
            raise AssertionError(f"not identical to generate at new token {done}")
        done += depth
        pending = result.bonus
    if pending != truth[steps]:
        raise AssertionError(f"not identical to generate at new token {steps}")
    return state


def main() -> None:
    """Print the three caches' sizes (each run first checked identical to ``generate``)."""
    config = Gemma3TextConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=16, sliding_window=WINDOW,
                              layer_types=["sliding_attention"] * 5 + ["full_attention"],
                              max_position_embeddings=2048)  # fmt: skip
    torch.manual_seed(0)
    build: Any = AutoModelForCausalLM.from_config
    model = build(config, attn_implementation="sdpa", dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    rng = random.Random(0)
    prompt = [rng.randrange(2, config.vocab_size) for _ in range(PROMPT)]
    steps = 8 * WINDOW
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps + 1, do_sample=False,
                         return_dict_in_generate=True)  # fmt: skip
    truth = out.sequences[0, PROMPT:].tolist()
    theirs = out.past_key_values
    print(f"window {WINDOW}, prompt {PROMPT}, {steps + 1} new tokens; layers {config.layer_types}")
    tokens = [int(layer.keys.shape[-2]) for layer in theirs.layers]
    print(f"generate      : tokens per layer {tokens}, KV {kv_bytes(theirs.layers) / 2**10:.1f} KiB")
    state = run_chains(ModelVerifier(model), prompt, truth, steps)
    tokens = [int(layer.keys.shape[-2]) for layer in state.cache.layers]
    print(f"engine='hf'   : tokens per layer {tokens}, KV {kv_bytes(state.cache.layers) / 2**10:.1f} KiB")
    buckets = BucketForward(Target.of(model), engine="buckets")
    run_chains(ModelVerifier(model, forward=buckets), prompt, truth, steps)
    cache = buckets.cache
    assert cache.keys is not None
    slots = [int(keys.shape[2]) for keys in cache.keys]
    print(f"bucket engines: slots per layer {slots} for {PROMPT + steps} tokens (rings of {cache.ring} slots), "
          f"KV {cache.nbytes / 2**10:.1f} KiB")  # fmt: skip
