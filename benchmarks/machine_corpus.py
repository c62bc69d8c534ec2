"""A >10M-token real corpus any machine with Python has, for datastore benchmarks.

GSM8K's training problems (``../shared/data/corpora``, when present: fields question and
answer), the Python standard library's source (site-packages excluded) and the text files
of ``/usr/share/doc``: about 26M tokens with the default model's tokenizer here.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "data"


def corpus_inputs() -> tuple[list[str], list[str]]:
    """(``--input`` paths, extra ``specdec datastore build`` arguments) for the corpus."""
    inputs: list[str] = []
    extra: list[str] = []
    gsm8k = SHARED / "corpora" / "gsm8k_train.jsonl"
    if gsm8k.exists():
        inputs.append(str(gsm8k))
        extra += ["--field", "question,answer"]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    inputs += [str(p) for p in sorted(stdlib.iterdir())
               if p.name != "site-packages" and (p.is_dir() or p.suffix == ".py")]
    doc = Path("/usr/share/doc")
    if doc.is_dir():
        inputs.append(str(doc))
    return inputs, extra


def run_build(kind: str, out: Path, max_tokens: int | None = None) -> dict[str, Any]:
    """``specdec datastore build --kind KIND`` over the corpus, as a user runs it, in a child process.

    Returns the builder's JSON report plus the wall time, the child's peak RSS (tokenizing
    included) and the number of inputs.
    """
    inputs, extra = corpus_inputs()
    command = [sys.executable, "-m", "specdec.cli", "datastore", "build", "--kind", kind, "--quiet",
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
