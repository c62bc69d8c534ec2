"""The one results format of ``specdec bench``: what a run writes and what every reader reads.

A run directory holds ``results.json``, rewritten (atomically) after every question::

    format      "specdec-bench/2" (readers also take "specdec-bench/1": the same, without
                the sampling judge's fields and the warm-up times)
    meta        command, argv, started/finished, machine (CPU, threads, GPU, load), versions
                (torch, transformers, git commit), model (name, dtype, device), settings,
                questions file and its digest, warmup {label: [seconds of prepare (specdec's methods),
                then of each warm-up call]}
    methods     [{label, name, options}], in the order given; the first is the speedup baseline
    baseline    the first method's label
    reference   the greedy method outputs are judged against; references {label: reference label}
    questions   [{question_id, category, fine_category, turns, runs: {label: record}}]
    summary     per category and overall, per method (:func:`specdec.bench.report.summarize`)

A record holds one method's figures on one question, summed over its turns: new_tokens,
wall_s, tokens_per_s, forwards, steps, emitted_by_steps, mat, forward_s (None where the
forwards cannot be hooked: a compiled peer), prefill/draft/verify/other seconds (specdec
methods), mean_tree_size, sources (steps and accepted tokens per drafter source: which part
of a composite served), stop_reason and output_sha1 per turn, and the judge's verdict
(:mod:`specdec.bench.judge`): identical, near_tie, near_boundary, first_difference, margin,
boundary, difference_turn, and for a greedy difference tokens (ours, the reference's),
top_two, agreement (tokens after it that are plain decoding of each branch) and finding.
``--keep-outputs`` adds ``prompts`` and ``outputs`` (token ids per turn), which ``specdec
bench replay`` reads.

This module imports nothing else of :mod:`specdec.bench`: the runner writes through it and
the report, the plot, the regression check and the replay read through it.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy
import torch
import transformers

import specdec
from specdec.cachefiles import write_atomically
from specdec.errors import SpecDecError
from specdec.models import DEFAULT_GGUF_NAME

RESULTS_FORMAT = "specdec-bench/2"
READABLE_FORMATS = ("specdec-bench/1", RESULTS_FORMAT)
RESULTS_FILE = "results.json"


def load_results(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``results.json`` of a run directory (or the file itself), of a readable format."""
    path = Path(directory)
    if path.is_dir():
        path = path / RESULTS_FILE
    if not path.is_file():
        raise SpecDecError(f"no benchmark results at {str(directory)!r} (expected a directory with {RESULTS_FILE})")
    results: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    if results.get("format") not in READABLE_FORMATS:
        raise SpecDecError(f"{path} is not a specdec bench results file (format {results.get('format')!r}; "
                           f"readable: {', '.join(READABLE_FORMATS)})")
    return results


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> None:
    """``data`` as indented JSON, written atomically (:func:`~specdec.cachefiles.write_atomically`)."""
    write_atomically(path, json.dumps(data, indent=1) + "\n")


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def machine_info() -> dict[str, Any]:
    """The hardware and load a run saw: timings mean little without it."""
    cpu = platform.processor() or ""
    memory_gib = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            cpu = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), cpu)
        with open("/proc/meminfo", encoding="utf-8") as handle:
            kib = next((int(line.split()[1]) for line in handle if line.startswith("MemTotal")), None)
            memory_gib = None if kib is None else round(kib / 2**20, 1)
    except OSError:
        pass
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_gib": memory_gib,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
    }


def software_versions() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": numpy.__version__,
        "specdec": specdec.__version__,
        "git": _git_state(),
    }


def _git_state() -> dict[str, Any] | None:
    """The checkout's commit and whether it had uncommitted changes (None outside git)."""
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if commit.returncode != 0:
        return None
    return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}


def model_info(model: Any, spec: str) -> dict[str, Any]:
    """What was benchmarked; ``spec`` is how the user named it (``default`` or a path)."""
    parameter = next(model.parameters())
    return {
        "name": DEFAULT_GGUF_NAME.split(".")[0] if spec == "default" else Path(spec).name,
        "name_or_path": str(getattr(model.config, "name_or_path", "") or type(model).__name__),
        "architecture": type(model).__name__,
        "dtype": str(parameter.dtype).removeprefix("torch."),
        "device": str(parameter.device),
        "parameters": sum(p.numel() for p in model.parameters()),
        "attention": getattr(model.config, "_attn_implementation", None),
    }


def file_digest(path: str | os.PathLike[str]) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def output_digest(tokens: Sequence[int]) -> str:
    """A short fingerprint of an output, so two saved runs can tell which answers changed."""
    return hashlib.sha1(json.dumps(list(tokens)).encode()).hexdigest()[:12]
