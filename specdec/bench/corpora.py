"""The corpora benchmarks build datastores from, and the one way they build them.

- :func:`build_datastore`: a datastore of any registered kind (``specdec.datastores.BUILDERS``)
  from tokenized documents (the quality check, the pytest-benchmark suite, ``costs``);
- :func:`gsm8k_documents`: GSM8K's training problems (``../shared/data``), tokenized;
- :func:`machine_corpus`: a >10M-token real corpus any machine with Python has: GSM8K (when
  present), the Python standard library's source (site-packages excluded) and the text files
  of ``/usr/share/doc``, about 26M tokens with the default model's tokenizer;
- :func:`cli_build`: ``specdec datastore build`` over that corpus in a child process, as a
  user runs it (its peak memory is the child's).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import sysconfig
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specdec.cachefiles import TokenizerIdentity
from specdec.datastores import BUILDERS
from specdec.datastores.corpus_reader import iter_texts, tokenize_documents

REPO = Path(__file__).resolve().parents[2]
SHARED_DATA = REPO.parent / "shared" / "data"
GSM8K = SHARED_DATA / "corpora" / "gsm8k_train.jsonl"


def build_datastore(kind: str, documents: Sequence[Any], path: str | os.PathLike[str],
                    tokenizer: Any) -> dict[str, Any]:
    """Build a ``kind`` datastore over ``documents`` (token id arrays) at ``path``; the builder's report.

    ``tokenizer`` is the tokenizer or its :class:`~specdec.cachefiles.TokenizerIdentity`.
    """
    identity = tokenizer if isinstance(tokenizer, TokenizerIdentity) else TokenizerIdentity.of(tokenizer)
    return BUILDERS[kind](documents, Path(path), identity, progress=False)


def gsm8k_documents(tokenizer: Any, max_tokens: int | None = None, corpus: str | os.PathLike[str] = GSM8K) -> list[Any]:
    """GSM8K's training problems (question and answer) as token id arrays, the first ``max_tokens``."""
    texts = iter_texts([corpus], fields=("question", "answer"))
    return list(tokenize_documents(tokenizer, texts, max_tokens=max_tokens, progress=False))


def machine_corpus() -> tuple[list[str], list[str]]:
    """(``--input`` paths, extra ``specdec datastore build`` arguments) of the >10M-token corpus."""
    inputs: list[str] = []
    extra: list[str] = []
    if GSM8K.exists():
        inputs.append(str(GSM8K))
        extra += ["--field", "question,answer"]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    inputs += [str(p) for p in sorted(stdlib.iterdir())
               if p.name != "site-packages" and (p.is_dir() or p.suffix == ".py")]
    if Path("/usr/share/doc").is_dir():
        inputs.append("/usr/share/doc")
    return inputs, extra


def cli_build(kind: str, out: Path, max_tokens: int | None = None) -> dict[str, Any]:
    """``specdec datastore build --kind KIND`` over :func:`machine_corpus` in a child process.

    Returns the builder's JSON report plus the wall time, the child's peak RSS (tokenizing
    included) and the number of inputs.
    """
    inputs, extra = machine_corpus()
    command = [sys.executable, "-m", "specdec.commands", "datastore", "build", "--kind", kind, "--quiet",
               "--tokenizer", "default", "-o", str(out), *extra, "--input", *inputs]
    if max_tokens:
        command += ["--max-tokens", str(max_tokens)]
    started = time.perf_counter()
    done = subprocess.run(command, check=True, capture_output=True, text=True, cwd=REPO)
    report: dict[str, Any] = json.loads(done.stdout)
    report["wall_s"] = round(time.perf_counter() - started, 2)
    report["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1)
    report["inputs"] = len(inputs)
    return report


def rss_mb() -> float:
    """This process's resident set (file-backed pages of memory maps included), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    return float("nan")
