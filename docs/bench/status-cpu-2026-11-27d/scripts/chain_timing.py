"""A fixed 6-node chain verified after a held-out prompt: the per-step seconds (shared by the scripts here)."""

import time

from specdec.api import Generator
from specdec.bench.oneoff import heldout_prompts
from specdec.models import encode_prompt, load_model
from specdec.types import DraftTree

model, tok = load_model(None)
generator = Generator(model, tok, drafter="sam+recycling", store=False)
generator.cost_model()
verifier = generator.verifier


def chain_seconds(prompt: int, steps: int) -> list[float]:
    """Seconds of each of ``steps`` verifications of a 6-node chain after held-out prompt ``prompt`` (mod 12)."""
    ids = encode_prompt(tok, heldout_prompts()[prompt % 12].text, None)
    state, pending, _ = verifier.prefill(ids, reserve=600)
    seconds = []
    for _ in range(steps):
        tree = DraftTree.chain(pending, [1000 + j for j in range(5)], source="x")
        started = time.perf_counter()
        pending = verifier.verify(state, tree, topk=8).bonus
        seconds.append(time.perf_counter() - started)
    verifier.release(state)
    return seconds
