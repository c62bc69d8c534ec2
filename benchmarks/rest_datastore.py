"""REST datastore costs: build, size, load and per-step retrieval on a >10M-token corpus.

One command reproduces every figure (wrap it in the shared timing lock)::

    flock /tmp/specdec-bench.lock python benchmarks/rest_datastore.py [--out PATH] [--skip-build]

The corpus: GSM8K's training answers (``../shared/data/corpora``, when present), the
Python standard library's source (site-packages excluded) and the text files of
``/usr/share/doc``, tokenized with the default model's tokenizer. The build runs as a user
would run it, ``specdec datastore build --kind rest ...`` in a child process (its peak RSS
includes tokenization); a second child rebuilds the file from its own documents to
measure the datastore build alone (suffix array, checks, write) above the documents'
memory. Load and retrieval run in fresh child processes, so each starts with no datastore
loaded (the OS page cache is warm after the build).

Retrieval is timed per step as a drafter sees it: the token streams of all Spec-Bench
questions (first turns), each position a step whose query is the 16 tokens ending there.
Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from machine_corpus import REPO, SHARED, rss_mb, run_build


def distribution(seconds: list[float]) -> dict[str, float]:
    import numpy as np

    ms = np.asarray(seconds) * 1e3
    return {"mean_ms": round(float(ms.mean()), 4), **{f"p{q}_ms": round(float(np.percentile(ms, q)), 4)
                                                      for q in (50, 90, 99)}, "max_ms": round(float(ms.max()), 4)}


def child_measure(path: str, verify: bool, questions: str) -> dict[str, Any]:
    """In a fresh process: load the store, then time every retrieval step over the questions."""
    import numpy as np

    from specdec.datastores import rest
    from specdec.drafters.rest import RestConfig, RestDrafter
    from specdec.models import load_tokenizer

    rest.native()  # build or load the extension before the clock starts
    before = rss_mb()
    started = time.perf_counter()
    store = rest.load(path, verify=verify)
    result: dict[str, Any] = {"verify": verify, "load_s": round(time.perf_counter() - started, 4),
                              "resident_after_load_mb": round(rss_mb() - before, 1), "tokens": store.num_tokens,
                              "documents": store.num_documents}
    if not questions:
        return result
    tokenizer = load_tokenizer()
    streams = [tokenizer(json.loads(line)["turns"][0], add_special_tokens=False)["input_ids"]
               for line in Path(questions).read_text().splitlines()]
    config = RestConfig(datastore=path)
    retrieve_s, propose_s, lengths, nodes = [], [], [], []
    for stream in streams:
        drafter = RestDrafter(store, config)
        drafter.reset(stream[:1])
        for i in range(1, len(stream)):
            tail = stream[max(0, i - 15) : i + 1]
            t0 = time.perf_counter()
            found = store.retrieve(tail)
            t1 = time.perf_counter()
            tree = drafter.propose(stream[i], 65)
            t2 = time.perf_counter()
            drafter.update([stream[i]], None)
            retrieve_s.append(t1 - t0)
            propose_s.append(t2 - t1)
            lengths.append(found.match_length)
            nodes.append(tree.size - 1)
    length = np.asarray(lengths)
    values, counts = np.unique(length, return_counts=True)
    result["retrieval"] = {
        "steps": len(retrieve_s),
        "retrieve_and_trie": distribution(retrieve_s),
        "drafter_propose": distribution(propose_s),
        "matched_fraction": round(float((length > 0).mean()), 4),
        "mean_match_length": round(float(length[length > 0].mean()), 3),
        "match_length_histogram": {int(v): int(c) for v, c in zip(values, counts, strict=True)},
        "mean_draft_nodes": round(float(np.mean(nodes)), 2),
    }
    result["resident_after_retrieval_mb"] = round(rss_mb() - before, 1)
    return result


def child_build_peak(path: str) -> dict[str, Any]:
    """In a fresh process: rebuild the store from its own documents; the build's own peak memory."""
    import numpy as np

    from specdec.datastores import rest

    store = rest.load(path, verify=False)
    documents = [np.asarray(store.document(i), dtype=np.int64) for i in range(store.num_documents)]  # as the CLI has
    baseline = rss_mb()
    started = time.perf_counter()
    report = rest.build(documents, Path(path).with_suffix(".rebuilt"), store.tokenizer, progress=False)
    elapsed = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    Path(report["path"]).unlink()
    return {"tokens": store.num_tokens, "documents": store.num_documents, "build_s": round(elapsed, 2),
            "rss_with_documents_mb": round(baseline, 1),
            "build_peak_above_documents_mb": round(peak - baseline, 1),
            "peak_bytes_per_token": round((peak - baseline) * 2**20 / store.num_tokens, 1), **report}


def in_child(*args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, *args], check=True, capture_output=True, text=True, cwd=REPO)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    from specdec.models import cache_dir

    if len(sys.argv) > 1 and sys.argv[1] == "_measure":
        print(json.dumps(child_measure(sys.argv[2], sys.argv[3] == "1", sys.argv[4])))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "_build_peak":
        print(json.dumps(child_build_peak(sys.argv[2])))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=cache_dir() / "datastores" / "rest-bench.rest")
    parser.add_argument("--skip-build", action="store_true", help="measure an existing --out file")
    args = parser.parse_args()
    report: dict[str, Any] = {}
    if not args.skip_build:
        report["cli_build"] = run_build("rest", args.out)
    report["build_alone"] = in_child("_build_peak", str(args.out))
    questions = SHARED / "spec_bench" / "question.jsonl"
    streams = str(questions) if questions.exists() else ""
    # verify=True (the default) reads the whole file for its checksums: its pages are then
    # resident, as in a drafter's process; verify=False shows cold first touches.
    report["load_verified_then_retrieval"] = in_child("_measure", str(args.out), "1", streams)
    report["load_unverified_then_retrieval"] = in_child("_measure", str(args.out), "0", streams)
    size = args.out.stat().st_size
    report["disk"] = {"bytes": size, "bytes_per_token": round(size / report["build_alone"]["tokens"], 3)
                      if "tokens" in report["build_alone"] else None}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
