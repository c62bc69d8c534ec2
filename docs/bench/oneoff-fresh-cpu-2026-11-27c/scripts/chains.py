"""The loop fl.py and newver.py share: chains of the given sizes verified after a held-out prompt, each timed."""

import time

from specdec.bench.oneoff import heldout_prompts
from specdec.models import encode_prompt
from specdec.types import DraftTree


def verify_chains(verifier, tokenizer, prompt, sizes):
    """Seconds of each verification, one chain of ``sizes[i]`` nodes per step, after held-out prompt ``prompt``."""
    ids = encode_prompt(tokenizer, heldout_prompts()[prompt].text, None)
    state, pending, _ = verifier.prefill(ids, reserve=600)
    seconds = []
    for size in sizes:
        tree = DraftTree.chain(pending, [1000 + j for j in range(size - 1)], source="x")
        started = time.perf_counter()
        pending = verifier.verify(state, tree, topk=8).bonus
        seconds.append(time.perf_counter() - started)
    verifier.release(state)
    return seconds
