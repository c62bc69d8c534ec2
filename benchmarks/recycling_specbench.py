"""Token Recycling and composite drafters on Spec-Bench, side by side, on the default model.

    flock /tmp/specdec-bench.lock python benchmarks/recycling_specbench.py --suite main --out runs/rec-main.json
    flock /tmp/specdec-bench.lock python benchmarks/recycling_specbench.py --suite recycling --out runs/rec-var.json
    python benchmarks/recycling_specbench.py --report runs/rec-main.json     # the tables again

Suites (each also runs ``none``, plain decoding through specdec's loop, the baseline):

- ``main``: Hugging Face prompt lookup, ``pld``, ``sam``, ``recycling``, ``sam+recycling``
  (Algorithm 2) and merged, ``pld+recycling`` both ways (``sam`` ones when registered).
  The side-by-side table of record comes from ``specdec bench`` (docs/algorithms/recycling.md);
  this suite is its quick stand-in.
- ``recycling``: the measured template vs a breadth-first one of the same size at node
  budgets 8, 16, 32, 81 (``n81`` is the default drafter, fresh per question); the matrix's
  lifetime (``kept``: one drafter object across all questions, in order) x prompt
  feedback (``+pf``).
- ``thresholds``: ``pld+recycling`` at l_threshold 1, 2, 3, either and merged.

Every specdec method verifies its drafter's whole tree (``budget="full"``), so MAT
measures the drafter, not the budget planner. Questions: the first turn of
``--per-category`` evenly spaced Spec-Bench questions per category (indices
``i * len / n``, disjoint from the template's calibration questions), chat-templated,
``--max-new-tokens`` each, greedy, stopping at EOS. Methods run
interleaved question by question (order rotated), so drifting machine load hits all
alike. Speedup is Spec-Bench's: a method's mean tokens/s over a category's questions
divided by the baseline's. MAT is tokens per target forward after the prefill, bonus
included; for Hugging Face's methods forwards are counted by a hook on the model.
Every output is compared with plain decoding's (identical, or a first difference on a
near-tie whose top-two logit margin is under 1e-3).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

QUESTIONS = Path("..") / "shared" / "data" / "spec_bench" / "question.jsonl"  # specdec.bench's default too
BUDGETS = (8, 16, 32, 81)


@dataclass
class Method:
    """One column: a specdec drafter (name, options, run arguments) or a Hugging Face peer."""

    label: str
    drafter: str = "none"
    options: dict[str, Any] = field(default_factory=dict)
    budget: str | int = "full"  # every node the drafter offers is verified (the papers' fixed budgets)
    prompt_feedback: bool = False
    keep: bool = False  # one drafter object across all questions (its learned state kept)
    hf_lookup: int | None = None  # Hugging Face: None = not a peer; 0 = plain generate; n = prompt lookup

    def runner(self, model: Any, tokenizer: Any, backend: str) -> Callable[[list[int], int], dict[str, Any]]:
        if self.hf_lookup is not None:
            return _hf_runner(model, tokenizer, self.hf_lookup)
        import specdec
        from specdec.drafters import DrafterContext, make_factory

        if self.keep:  # a drafter object is reused as is by Generator: its matrix persists
            vocab = int(model.get_output_embeddings().weight.shape[0])
            kept = make_factory(self.drafter, self.options, DrafterContext(vocab_size=vocab)).create()
            generator = specdec.Generator(model, tokenizer, drafter=kept, backend=backend)
        else:
            generator = specdec.Generator(
                model, tokenizer, drafter=self.drafter, drafter_options=self.options, backend=backend
            )

        def run(prompt: list[int], max_new: int) -> dict[str, Any]:
            result = generator.generate(
                prompt, max_new_tokens=max_new, budget=self.budget, prompt_feedback=self.prompt_feedback
            )
            s = result.stats
            return {
                "tokens": result.tokens, "wall_s": s.total_s, "steps": s.steps, "emitted": s.emitted_by_steps,
                "draft_s": s.draft_s, "mean_tree": s.mean_tree_size, "steps_by_source": s.steps_by_source,
                "accepted_by_source": s.accepted_by_source,
            }

        return run


def _hf_runner(model: Any, tokenizer: Any, lookup: int) -> Callable[[list[int], int], dict[str, Any]]:
    from specdec.models import eos_token_ids

    eos = list(eos_token_ids(model, tokenizer))
    forwards = [0]
    model.register_forward_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    extra = {"prompt_lookup_num_tokens": lookup} if lookup else {}

    def run(prompt: list[int], max_new: int) -> dict[str, Any]:
        ids = torch.tensor([prompt])
        before = forwards[0]
        started = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new,
                                 eos_token_id=eos, pad_token_id=eos[0], **extra)
        wall = time.perf_counter() - started
        tokens = out[0, len(prompt):].tolist()
        cut = next((i + 1 for i, t in enumerate(tokens) if t in eos), len(tokens))
        steps = forwards[0] - before - 1  # the prefill decides the first token
        return {"tokens": tokens[:cut], "wall_s": wall, "steps": steps, "emitted": len(tokens) - 1}

    return run


def suite(name: str) -> list[Method]:
    from specdec.drafters import REGISTRY

    methods = [Method("none")]
    if name == "main":
        methods += [Method("hf-pld", hf_lookup=10), Method("pld", "pld")]
        if "sam" in REGISTRY:
            methods.append(Method("sam", "sam"))
        methods.append(Method("recycling", "recycling"))
        for retrieval in ("sam", "pld"):
            if retrieval in REGISTRY:
                methods += [Method(f"{retrieval}+recycling", f"{retrieval}+recycling"),
                            Method(f"{retrieval}+recycling-merge", f"{retrieval}+recycling", {"mode": "merge"})]
    elif name == "recycling":
        for n in BUDGETS:  # the measured template vs a breadth-first one of the same size
            methods += [Method(f"n{n}", "recycling", {"num_nodes": n}),
                        Method(f"bfs{n}", "recycling", {"template": f"breadth-first-{n}"})]
        methods += [
            Method("kept", "recycling", keep=True),
            Method("fresh+pf", "recycling", prompt_feedback=True),
            Method("kept+pf", "recycling", keep=True, prompt_feedback=True),
        ]
    elif name == "thresholds":
        for threshold in (1, 2, 3):
            for mode in ("either", "merge"):
                methods.append(Method(f"pld+rec-t{threshold}-{mode}", "pld+recycling",
                                      {"threshold": threshold, "mode": mode}))
    else:
        raise SystemExit(f"unknown suite {name!r}: main, recycling, thresholds")
    return methods


def run_suite(args: argparse.Namespace) -> dict[str, Any]:
    import specdec
    from specdec.bench.questions import load_questions, select_questions
    from specdec.models import encode_prompt
    from specdec.testing import compare_outputs

    model, tokenizer = specdec.load_model()
    methods = suite(args.suite)
    runners = {m.label: m.runner(model, tokenizer, args.backend) for m in methods}
    questions = [(q.category, q.turns[0]) for q in select_questions(load_questions(args.questions), args.per_category)]
    warm = encode_prompt(tokenizer, questions[0][1])
    for label, run in runners.items():  # first calls pay one-time costs (kernels, caches)
        if not any(m.keep for m in methods if m.label == label):
            run(warm, 8)
    rows: list[dict[str, Any]] = []
    for index, (category, text) in enumerate(questions):
        prompt = encode_prompt(tokenizer, text)
        labels = list(runners)
        order = labels[index % len(labels):] + labels[: index % len(labels)]
        outputs = {label: runners[label](prompt, args.max_new_tokens) for label in order}
        base = outputs["none"]["tokens"]
        for label, out in outputs.items():
            comparison = compare_outputs(model, prompt, out["tokens"], base)
            out.update(label=label, category=category, question=index, identical=comparison.identical,
                       acceptable=comparison.acceptable, new_tokens=len(out["tokens"]))
            del out["tokens"]
            rows.append(out)
        print(f"[{index + 1}/{len(questions)}] {category}: " + ", ".join(
            f"{o['label']} {o['emitted'] / max(o['steps'], 1):.2f}" for o in outputs.values()), file=sys.stderr)
    return {"suite": args.suite, "per_category": args.per_category, "max_new_tokens": args.max_new_tokens,
            "command": " ".join(sys.argv), "rows": rows}


def report(results: dict[str, Any]) -> str:
    rows = results["rows"]
    labels = list(dict.fromkeys(r["label"] for r in rows))
    categories = list(dict.fromkeys(r["category"] for r in rows))

    def pick(label: str, category: str | None = None) -> list[dict[str, Any]]:
        return [r for r in rows if r["label"] == label and (category is None or r["category"] == category)]

    def mat(sel: list[dict[str, Any]]) -> float:
        return sum(r["emitted"] for r in sel) / max(1, sum(r["steps"] for r in sel))

    def tps(sel: list[dict[str, Any]]) -> float:
        return statistics.mean(r["new_tokens"] / r["wall_s"] for r in sel)

    lines = [f"suite {results['suite']}: {results['per_category']} questions per category, "
             f"{results['max_new_tokens']} new tokens; `{results['command']}`", ""]
    header = "| method | " + " | ".join(categories) + " | overall |"
    for title, cell in (
        ("MAT", lambda sel, base: f"{mat(sel):.2f}"),
        ("tokens/s", lambda sel, base: f"{tps(sel):.1f}"),
        ("speedup vs none", lambda sel, base: f"{tps(sel) / tps(base):.2f}x"),
    ):
        lines += [f"**{title}**", "", header, "|" + "---|" * (len(categories) + 2)]
        for label in labels:
            cells = [cell(pick(label, c), pick("none", c)) for c in categories]
            lines.append(f"| {label} | " + " | ".join(cells) + f" | {cell(pick(label), pick('none'))} |")
        lines.append("")
    lines += ["| method | identical | near-tie | mean tree | drafter us/step | steps by source | accepted by source |",
              "|---|---|---|---|---|---|---|"]
    for label in labels:
        sel = pick(label)
        identical = sum(r["identical"] for r in sel)
        near = sum(r["acceptable"] and not r["identical"] for r in sel)
        draft = (f"{1e6 * sum(r['draft_s'] for r in sel) / max(1, sum(r['steps'] for r in sel)):.0f}"
                 if "draft_s" in sel[0] else "-")
        tree = f"{statistics.mean(r['mean_tree'] for r in sel):.1f}" if "mean_tree" in sel[0] else "-"
        steps: dict[str, int] = {}
        accepted: dict[str, int] = {}
        for r in sel:
            for key, value in r.get("steps_by_source", {}).items():
                steps[key] = steps.get(key, 0) + value
            for key, value in r.get("accepted_by_source", {}).items():
                accepted[key] = accepted.get(key, 0) + value
        lines.append(f"| {label} | {identical}/{len(sel)} | {near} | {tree} | {draft} | {steps or '-'} | "
                     f"{accepted or '-'} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", default="main")
    parser.add_argument("--per-category", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--questions", default=str(QUESTIONS))
    parser.add_argument("--out", default=None, help="results JSON to write")
    parser.add_argument("--backend", default="auto", help="specdec's verification backend (auto, torch, cuda_ext)")
    parser.add_argument("--report", default=None, help="print the tables of a saved results JSON")
    args = parser.parse_args(argv)
    if args.report:
        print(report(json.loads(Path(args.report).read_text())))
        return 0
    if not Path(args.questions).is_file():
        raise SystemExit(f"no Spec-Bench questions at {args.questions} (../shared/data ships with the team checkout)")
    results = run_suite(args)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
