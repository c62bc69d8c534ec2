"""Is a sampled run's difference a rounding flip at a CDF boundary (the sampling near-tie)?

    python benchmarks/sampling_near_tie.py QUESTION_ID DRAFTER POSITION

Samples Spec-Bench question ``QUESTION_ID`` (first turn, temperature 0.7, seed 1, 128 new
tokens, as ``docs/benchmarks.md``'s run) with ``none`` and with ``DRAFTER``, says whether
they now agree, then, at output index ``POSITION`` (or the first difference), prints where
the position's uniform draw falls in the cumulative distribution computed from one
full-sequence forward, and its distance to the nearest bucket boundary. A distance around
1e-6 means float32 rounding (tree forward vs one-token forwards) can move the boundary
past the draw: the token can flip without any error in the algorithm.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

import specdec
from specdec.models import encode_prompt, load_model
from specdec.sampling import SamplingParams, position_uniform, process_logits

QUESTIONS = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "spec_bench" / "question.jsonl"
SEED, TEMPERATURE = 1, 0.7


def main() -> None:
    question_id, drafter, position = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    model, tokenizer = load_model()
    records = [json.loads(line) for line in QUESTIONS.read_text().splitlines()]
    question = next(r for r in records if r["question_id"] == question_id)
    prompt = encode_prompt(tokenizer, question["turns"][0])
    options = dict(temperature=TEMPERATURE, seed=SEED, max_new_tokens=128)
    plain = specdec.run(model, prompt, "none", **options).tokens
    drafted = specdec.run(model, prompt, drafter, **options).tokens
    first = next((k for k, (a, b) in enumerate(zip(plain, drafted, strict=False)) if a != b), None)
    print(f"{drafter} identical to plain sampling now: {plain == drafted}; first difference: {first}")
    index = position if first is None else first
    prefix = prompt + plain[:index]
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prefix])).logits[0, -1:]
    probs = process_logits(logits, SamplingParams(temperature=TEMPERATURE, seed=SEED)).softmax(-1).double()[0]
    cdf = probs.cumsum(0)
    target = position_uniform(SEED, len(prefix)) * float(cdf[-1])
    token = int(torch.searchsorted(cdf, torch.tensor([target], dtype=torch.float64), right=True)[0])
    low, high = (float(cdf[token - 1]) if token else 0.0), float(cdf[token])
    print(f"index {index}: draw {target:.12f} in token {token}'s bucket [{low:.12f}, {high:.12f}), "
          f"distance to the nearest boundary {min(target - low, high - target):.2e}; "
          f"plain sampling emitted {plain[index]}")


if __name__ == "__main__":
    main()
