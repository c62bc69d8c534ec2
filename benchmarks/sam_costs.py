"""Static suffix automaton and ``sam`` drafter costs: build, size, load, and per-step cost.

One command reproduces every figure (wrap it in the shared timing lock)::

    flock /tmp/specdec-bench.lock python benchmarks/sam_costs.py [--out PATH] [--skip-build]

The corpus: GSM8K's training problems and answers (``../shared/data/corpora``, when
present), the Python standard library's source (site-packages excluded) and the text
files of ``/usr/share/doc``, tokenized with the default model's tokenizer (the same corpus
as ``benchmarks/rest_datastore.py``). The build runs as a user runs it, ``specdec datastore
build --kind sam ...`` in a child process, whose peak RSS is the build's peak memory (the
tokenizer included; the builder's own arrays are ``builder_peak_bytes``). Load and steps
run in fresh child processes, so each starts with no automaton cached in the process (the
OS page cache is warm after the build).

Drafter steps are timed as the engine runs them (``propose`` then ``update``) with a
2048-token context: the drafter gets the first 2048 tokens of a text as the prompt, then
walks the next ones, each step accepting the longest prefix of its chain that the text
continues with (a verifier whose model writes exactly this text). Two texts: the
Spec-Bench first turns, concatenated (typical: few long matches, mostly no chain), and a
stretch of the corpus itself (the worst case: every step drafts and accepts a 39-token
static chain). Wall-clock percentiles and the CPU-time mean (immune to other processes on
a shared machine) are reported. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from machine_corpus import REPO, SHARED, rss_mb, run_build

CONTEXT = 2048
STEPS_TEXT = 3000  # tokens of text walked after the context


def distribution_us(values: list[float]) -> dict[str, float]:
    import numpy as np

    a = np.asarray(values) * 1e6
    return {"mean_us": round(float(a.mean()), 2), "p50_us": round(float(np.percentile(a, 50)), 2),
            "p90_us": round(float(np.percentile(a, 90)), 2), "p99_us": round(float(np.percentile(a, 99)), 2),
            "max_us": round(float(a.max()), 2), "steps": len(values)}


def child_load(path: Path, verify: bool) -> dict[str, Any]:
    """Load (first in this process, then cached), resident memory before and after touching it."""
    from specdec.datastores.sam import StaticSuffixAutomaton, native

    native()  # build or load the extension before the clock starts
    before = rss_mb()
    started, cpu_started = time.perf_counter(), time.process_time()
    sam = StaticSuffixAutomaton.load(path, verify=verify)
    load_s, load_cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
    after_load = rss_mb()
    started = time.perf_counter()
    assert StaticSuffixAutomaton.load(path, verify=verify) is sam
    cached_s = time.perf_counter() - started
    touched = sum(int(a.sum(dtype="uint64")) for a in sam.arrays.values())  # every page resident
    tokens = sam.num_tokens
    return {
        "verify": verify, "load_s": round(load_s, 4), "load_cpu_s": round(load_cpu_s, 4),
        "cached_load_s": round(cached_s, 6),
        "tokens": tokens, "documents": sam.num_documents, "states": sam.num_states, "edges": sam.num_edges,
        "states_per_token": round(sam.num_states / tokens, 3), "edges_per_token": round(sam.num_edges / tokens, 3),
        "mapped_bytes_per_token": round(sam.nbytes / tokens, 2),
        "rss_delta_after_load_mb": round(after_load - before, 1),
        "rss_delta_fully_touched_mb": round(rss_mb() - before, 1),
        "rss_bytes_per_token_fully_touched": round((rss_mb() - before) * 2**20 / tokens, 2),
        "checksum_of_all_sections": touched % 1000,
    }


def spec_bench_text() -> list[int]:
    """Spec-Bench first turns, concatenated and tokenized."""
    from specdec.models import load_tokenizer

    tokenizer = load_tokenizer()
    questions = [json.loads(line) for line in (SHARED / "spec_bench" / "question.jsonl").read_text().splitlines()]
    text = "\n\n".join(q["turns"][0] for q in questions)
    ids: list[int] = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids[: CONTEXT + STEPS_TEXT]


def corpus_text(path: Path) -> list[int]:
    """The longest document of the corpus (its first 5048 tokens): static chains at every step."""
    from specdec.datastores.sam import StaticSuffixAutomaton

    arrays = StaticSuffixAutomaton.load(path, verify=False).arrays
    starts = arrays["doc_starts"]
    longest = int((starts[1:] - starts[:-1]).argmax())
    first = int(starts[longest])
    return [int(t) for t in arrays["tokens"][first : first + CONTEXT + STEPS_TEXT]]


def walk(drafter: Any, text: list[int]) -> dict[str, Any]:
    """Steps as the engine runs them, accepting what the text continues with."""
    from collections import Counter

    drafter.reset(text[:CONTEXT])
    position = CONTEXT  # text[position] is the pending token
    totals, proposes, updates, sources = [], [], [], Counter()
    emitted, cpu = 0, 0.0
    while position < len(text) - 1:
        pending = text[position]
        cpu_started = time.process_time()
        started = time.perf_counter()
        tree = drafter.propose(pending, 40)
        proposed = time.perf_counter()
        cpu += time.process_time() - cpu_started
        accepted = [pending]
        for token in tree.tokens[1:]:
            if position + len(accepted) >= len(text) or text[position + len(accepted)] != token:
                break
            accepted.append(token)
        cpu_started = time.process_time()
        between = time.perf_counter()
        drafter.update(accepted, None)
        updated = time.perf_counter()
        cpu += time.process_time() - cpu_started
        proposes.append(proposed - started)
        updates.append(updated - between)
        totals.append((proposed - started) + (updated - between))
        sources[tree.source] += 1
        emitted += len(accepted)
        position += len(accepted)
    return {"propose+update": distribution_us(totals), "propose+update_cpu_mean_us": round(cpu / len(totals) * 1e6, 2),
            "propose": distribution_us(proposes), "update": distribution_us(updates),
            "simulated_mat": round(emitted / len(totals), 3), "steps_by_source": dict(sources)}


def child_steps(path: Path, static: bool) -> dict[str, Any]:
    from specdec.datastores.sam import StaticSuffixAutomaton
    from specdec.drafters.sam import SamConfig, SamDrafter

    drafter = SamDrafter(SamConfig(), StaticSuffixAutomaton.load(path, verify=False) if static else None)
    result: dict[str, Any] = {"context_tokens": CONTEXT, "static": static}
    for name, text in (("spec_bench_text", spec_bench_text()), ("corpus_text", corpus_text(path))):
        walk(drafter, text)  # warm caches and pages once
        result[name] = walk(drafter, text)
    return result


def in_child(*args: str) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", *args]
    done = subprocess.run(command, check=True, capture_output=True, text=True, cwd=REPO)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    from specdec.models import cache_dir

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=cache_dir() / "datastores" / "sam-bench.sam")
    parser.add_argument("--skip-build", action="store_true", help="measure an existing --out file")
    parser.add_argument("--max-tokens", type=int, default=None, help="cap the corpus (default: all of it)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "load":
            print(json.dumps(child_load(Path(rest[0]), rest[1] == "1")))
        else:
            print(json.dumps(child_steps(Path(rest[0]), rest[1] == "1")))
        return
    report: dict[str, Any] = {}
    if not args.skip_build:
        report["build"] = run_build("sam", args.out, args.max_tokens)
    report["disk"] = {"bytes": args.out.stat().st_size}
    report["load_verified"] = in_child("load", str(args.out), "1")
    report["load_unverified"] = in_child("load", str(args.out), "0")
    report["disk"]["bytes_per_token"] = round(report["disk"]["bytes"] / report["load_verified"]["tokens"], 2)
    if (SHARED / "spec_bench" / "question.jsonl").exists():
        report["steps_dynamic_only"] = in_child("steps", str(args.out), "0")
        report["steps_with_static"] = in_child("steps", str(args.out), "1")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
