"""``specdec bench costs``: a datastore's build, size, load and per-step costs on a >10M-token corpus.

The corpus is :func:`specdec.bench.corpora.machine_corpus` (GSM8K, the Python standard
library, ``/usr/share/doc``; ~26M tokens). The build runs as a user runs it
(``specdec datastore build`` in a child process, whose peak RSS is the build's, tokenizer
included). Every load and step measurement runs in a fresh process (``spawn``), so each
starts with nothing loaded (the OS page cache is warm after the build).

- ``sam``: load with and without the sections' checksums (resident memory once every page is
  touched), then the drafter's steps (``propose`` + ``update``, as the engine calls them)
  with a 2,048-token context, the dynamic automaton alone and with the static one, over two
  texts: Spec-Bench's first turns (typical: few long matches) and a stretch of the corpus
  itself (the worst case: every step drafts and accepts a 39-token static chain). Each
  step accepts the longest prefix of its chain that the text continues with.
- ``rest``: the datastore build alone (from the file's own documents: suffix array,
  checks, write; its peak above the documents), then load with and without checksums and
  one retrieval per position of Spec-Bench's first turns (the 16 tokens ending there).
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import resource
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from specdec.bench.corpora import SHARED_DATA, cli_build, rss_mb
from specdec.cachefiles import folder
from specdec.datastores import rest
from specdec.datastores.sam import StaticSuffixAutomaton, native
from specdec.drafters.rest import RestConfig, RestDrafter
from specdec.drafters.sam import SamConfig, SamDrafter
from specdec.models import load_tokenizer

CONTEXT = 2048  # tokens of context before the walked text (sam steps)
STEPS_TEXT = 3000  # tokens of text walked after it
QUESTIONS = SHARED_DATA / "spec_bench" / "question.jsonl"


def distribution(seconds: list[float], unit: str) -> dict[str, float]:
    """Mean, percentiles and max of ``seconds`` in ``unit`` ("us" or "ms")."""
    values = np.asarray(seconds) * (1e6 if unit == "us" else 1e3)
    stats = {"mean": float(values.mean()), **{f"p{q}": float(np.percentile(values, q)) for q in (50, 90, 99)},
             "max": float(values.max())}
    return {f"{name}_{unit}": round(value, 4) for name, value in stats.items()} | {"steps": len(seconds)}


def in_child(function: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """``function(*args)`` in a fresh interpreter: nothing cached, its own peak memory."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        result: dict[str, Any] = pool.submit(function, *args).result()
    return result


def question_turns() -> list[str]:
    """Spec-Bench's first turns (none where ../shared is absent)."""
    if not QUESTIONS.is_file():
        return []
    return [json.loads(line)["turns"][0] for line in QUESTIONS.read_text(encoding="utf-8").splitlines()]


@functools.cache
def _tokenizer() -> Any:
    return load_tokenizer()


def tokenize(text: str) -> list[int]:
    return list(_tokenizer()(text, add_special_tokens=False)["input_ids"])


# -- sam -----------------------------------------------------------------------------------------


def sam_load(path: str, verify: bool) -> dict[str, Any]:
    """Load (first in this process, then cached), resident memory before and after touching it."""
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
        "cached_load_s": round(cached_s, 6), "tokens": tokens, "documents": sam.num_documents,
        "states": sam.num_states, "edges": sam.num_edges, "states_per_token": round(sam.num_states / tokens, 3),
        "edges_per_token": round(sam.num_edges / tokens, 3), "mapped_bytes_per_token": round(sam.nbytes / tokens, 2),
        "rss_delta_after_load_mb": round(after_load - before, 1),
        "rss_delta_fully_touched_mb": round(rss_mb() - before, 1),
        "rss_bytes_per_token_fully_touched": round((rss_mb() - before) * 2**20 / tokens, 2),
        "checksum_of_all_sections": touched % 1000,
    }


def _walk(drafter: Any, text: list[int]) -> dict[str, Any]:
    """Steps as the engine runs them, each accepting what the text continues with."""
    drafter.reset(text[:CONTEXT])
    position = CONTEXT  # text[position] is the pending token
    totals, proposes, updates, sources, emitted, cpu = [], [], [], Counter[str](), 0, 0.0
    while position < len(text) - 1:
        pending = text[position]
        cpu_started, started = time.process_time(), time.perf_counter()
        tree = drafter.propose(pending, 40)
        proposed = time.perf_counter()
        cpu += time.process_time() - cpu_started
        accepted = [pending]
        for token in tree.tokens[1:]:
            if position + len(accepted) >= len(text) or text[position + len(accepted)] != token:
                break
            accepted.append(token)
        cpu_started, between = time.process_time(), time.perf_counter()
        drafter.update(accepted, None)
        updated = time.perf_counter()
        cpu += time.process_time() - cpu_started
        proposes.append(proposed - started)
        updates.append(updated - between)
        totals.append((proposed - started) + (updated - between))
        sources[tree.source] += 1
        emitted += len(accepted)
        position += len(accepted)
    return {"propose+update": distribution(totals, "us"), "propose": distribution(proposes, "us"),
            "update": distribution(updates, "us"), "propose+update_cpu_mean_us": round(cpu / len(totals) * 1e6, 2),
            "simulated_mat": round(emitted / len(totals), 3), "steps_by_source": dict(sources)}


def sam_steps(path: str, static: bool) -> dict[str, Any]:
    sam = StaticSuffixAutomaton.load(path, verify=False)
    drafter = SamDrafter(SamConfig(), sam if static else None)
    starts = sam.arrays["doc_starts"]
    longest = int((starts[1:] - starts[:-1]).argmax())
    corpus = [int(t) for t in sam.arrays["tokens"][int(starts[longest]):][: CONTEXT + STEPS_TEXT]]
    spec_bench = tokenize("\n\n".join(question_turns()))[: CONTEXT + STEPS_TEXT]
    result: dict[str, Any] = {"context_tokens": CONTEXT, "static": static}
    for name, text in (("spec_bench_text", spec_bench), ("corpus_text", corpus)):
        _walk(drafter, text)  # warm caches and pages once
        result[name] = _walk(drafter, text)
    return result


# -- rest ----------------------------------------------------------------------------------------


def rest_build_alone(path: str) -> dict[str, Any]:
    """Rebuild the store from its own documents: the build's time and its peak above the documents."""
    store = rest.load(path, verify=False)
    documents = [np.asarray(store.document(i), dtype=np.int64) for i in range(store.num_documents)]  # as the CLI has
    baseline = rss_mb()
    started = time.perf_counter()
    report = rest.build(documents, Path(path).with_suffix(".rebuilt"), store.tokenizer, progress=False)
    elapsed = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    Path(report["path"]).unlink()
    return {"tokens": store.num_tokens, "documents": store.num_documents, "build_s": round(elapsed, 2),
            "rss_with_documents_mb": round(baseline, 1), "build_peak_above_documents_mb": round(peak - baseline, 1),
            "peak_bytes_per_token": round((peak - baseline) * 2**20 / store.num_tokens, 1), **report}


def rest_load_and_retrieve(path: str, verify: bool) -> dict[str, Any]:
    """Load the store, then time one retrieval (and the drafter's propose) per question position."""
    rest.native()  # build or load the extension before the clock starts
    before = rss_mb()
    started = time.perf_counter()
    store = rest.load(path, verify=verify)
    result: dict[str, Any] = {"verify": verify, "load_s": round(time.perf_counter() - started, 4),
                              "resident_after_load_mb": round(rss_mb() - before, 1), "tokens": store.num_tokens,
                              "documents": store.num_documents}
    retrieve_s, propose_s, lengths, nodes = [], [], [], []
    for stream in map(tokenize, question_turns()):
        drafter = RestDrafter(store, RestConfig(datastore=path))
        drafter.reset(stream[:1])
        for i in range(1, len(stream)):
            t0 = time.perf_counter()
            found = store.retrieve(stream[max(0, i - 15) : i + 1])
            t1 = time.perf_counter()
            tree = drafter.propose(stream[i], 65)
            t2 = time.perf_counter()
            drafter.update([stream[i]], None)
            retrieve_s.append(t1 - t0)
            propose_s.append(t2 - t1)
            lengths.append(found.match_length)
            nodes.append(tree.size - 1)
    if retrieve_s:
        length = np.asarray(lengths)
        values, counts = np.unique(length, return_counts=True)
        result["retrieval"] = {
            "retrieve_and_trie": distribution(retrieve_s, "ms"), "drafter_propose": distribution(propose_s, "ms"),
            "matched_fraction": round(float((length > 0).mean()), 4),
            "mean_match_length": round(float(length[length > 0].mean()), 3),
            "match_length_histogram": {int(v): int(c) for v, c in zip(values, counts, strict=True)},
            "mean_draft_nodes": round(float(np.mean(nodes)), 2),
        }
        result["resident_after_retrieval_mb"] = round(rss_mb() - before, 1)
    return result


def measure(kind: str, out: Path | None, *, skip_build: bool = False, max_tokens: int | None = None) -> dict[str, Any]:
    """Every figure of ``kind``'s datastore at ``out`` (built first unless ``skip_build``), as one document."""
    path = out or folder("datastores") / f"{kind}-bench.{kind}"
    report: dict[str, Any] = {}
    if not skip_build:
        report["cli_build"] = cli_build(kind, path, max_tokens)
    if kind == "sam":
        report["load_verified"] = in_child(sam_load, str(path), True)
        report["load_unverified"] = in_child(sam_load, str(path), False)
        tokens = report["load_verified"]["tokens"]
        if QUESTIONS.is_file():
            report["steps_dynamic_only"] = in_child(sam_steps, str(path), False)
            report["steps_with_static"] = in_child(sam_steps, str(path), True)
    else:
        report["build_alone"] = in_child(rest_build_alone, str(path))
        # verify=True reads the whole file for its checksums: its pages are then resident, as in
        # a drafter's process; verify=False shows cold first touches.
        report["load_verified_then_retrieval"] = in_child(rest_load_and_retrieve, str(path), True)
        report["load_unverified_then_retrieval"] = in_child(rest_load_and_retrieve, str(path), False)
        tokens = report["build_alone"]["tokens"]
    size = path.stat().st_size
    report["disk"] = {"path": str(path), "bytes": size, "bytes_per_token": round(size / tokens, 3)}
    return report
