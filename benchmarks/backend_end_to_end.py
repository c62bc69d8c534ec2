"""End to end on the default model: the same generations through the torch and the cuda_ext backend.

    flock /tmp/specdec-bench.lock python benchmarks/backend_end_to_end.py
    flock /tmp/specdec-bench.lock python benchmarks/backend_end_to_end.py --drafters pld recycling --per-category 2

For each drafter and each question (the first turn of ``--per-category`` Spec-Bench questions
per category, chat-templated; a few built-in prompts when ../shared/data is absent) the
engine runs once per backend, backends interleaved question by question, every drafter tree
verified whole (no budget planner, so both backends verify the very same trees). Reports
per drafter and backend: tokens, steps, MAT, tokens/s, verification time per step, and
whether the outputs of the two backends are identical (they must be: both feed the model
the same inputs and walk the same logits).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
QUESTIONS = REPO.parent / "shared" / "data" / "spec_bench" / "question.jsonl"
FALLBACK_PROMPTS = (
    "Summarize in two sentences: the quick brown fox jumps over the lazy dog, again and again, all day.",
    "Write a Python function that returns the squares of a list of numbers, with a docstring.",
    "Translate to French: I would like a cup of coffee and a croissant, please.",
)
BACKENDS = ("torch", "cuda_ext")


def prompts(per_category: int) -> list[tuple[str, str]]:
    """(category, first-turn text): evenly spaced questions per Spec-Bench category."""
    from specdec.bench.questions import load_questions, select_questions

    if not QUESTIONS.is_file():
        print(f"{QUESTIONS} is absent: using {len(FALLBACK_PROMPTS)} built-in prompts", file=sys.stderr)
        return [("builtin", text) for text in FALLBACK_PROMPTS]
    return [(q.category, q.turns[0]) for q in select_questions(load_questions(QUESTIONS), per_category)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drafters", nargs="+", default=["pld"], help="registered drafter names")
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    args = parser.parse_args(argv)

    from specdec.backends import make_verifier
    from specdec.drafters import DrafterContext, make_factory
    from specdec.engine import StopRules, decode
    from specdec.models import encode_prompt, eos_token_ids, load_model

    model, tokenizer = load_model()
    verifiers = {backend: make_verifier(model, backend) for backend in BACKENDS}
    context = DrafterContext(vocab_size=verifiers["torch"].vocab_size, tokenizer=tokenizer,
                             eos_token_ids=eos_token_ids(model, tokenizer))
    rules = StopRules(args.max_new_tokens, frozenset(eos_token_ids(model, tokenizer)))
    questions = [(category, encode_prompt(tokenizer, text)) for category, text in prompts(args.per_category)]
    print(f"{len(questions)} questions, max {args.max_new_tokens} new tokens, torch threads "
          f"{__import__('torch').get_num_threads()}")
    print("| drafter | backend | tokens | steps | MAT | tokens/s | verify ms/step | identical |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for name in args.drafters:
        factory = make_factory(name, {}, context)
        totals: dict[str, dict[str, Any]] = {b: {"tokens": 0, "steps": 0, "emitted": 0, "s": 0.0, "verify_s": 0.0}
                                             for b in BACKENDS}
        identical = 0
        for index, (_, prompt) in enumerate(questions):
            outputs = {}
            order = BACKENDS if index % 2 == 0 else BACKENDS[::-1]  # interleaved: drifting load hits both alike
            for backend in order:
                started = time.perf_counter()
                result = decode(verifiers[backend], factory.create(), prompt, rules)
                elapsed = time.perf_counter() - started
                stats, total = result.stats, totals[backend]
                total["tokens"] += stats.new_tokens
                total["steps"] += stats.steps
                total["emitted"] += stats.emitted_by_steps
                total["s"] += elapsed
                total["verify_s"] += stats.verify_s
                outputs[backend] = result.tokens
            identical += outputs["torch"] == outputs["cuda_ext"]
        for backend in BACKENDS:
            total = totals[backend]
            mat = total["emitted"] / max(total["steps"], 1)
            print(f"| {name} | {backend} | {total['tokens']} | {total['steps']} | {mat:.3f} | "
                  f"{total['tokens'] / total['s']:.2f} | {1e3 * total['verify_s'] / max(total['steps'], 1):.1f} | "
                  f"{identical}/{len(questions)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
