"""``specdec bench llamacpp``'s own logic, without llama.cpp: the llama.cpp arm's loop (greedy settings,
cache cleared per prompt, stops at its end-of-text token or the token limit) on a stand-in ``Llama``,
the summary's ratios, the verdict lines, and the clear error where llama-cpp-python is missing."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from specdec.bench import llamacpp
from specdec.errors import SpecDecError


class FakeLlama:
    """Counts from the last prompt token up; 99 is its end-of-text token."""

    made: ClassVar[list[FakeLlama]] = []

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.resets = 0
        self.settings: list[dict[str, float]] = []
        FakeLlama.made.append(self)

    def token_eos(self) -> int:
        return 99

    def reset(self) -> None:
        self.resets += 1

    def generate(self, tokens: Sequence[int], **settings: float) -> Iterator[int]:
        self.settings.append(settings)
        token = tokens[-1]
        while True:
            token += 1
            yield token


@pytest.fixture
def fake_llama(monkeypatch: pytest.MonkeyPatch) -> type[FakeLlama]:
    FakeLlama.made = []
    monkeypatch.setitem(sys.modules, "llama_cpp", types.SimpleNamespace(Llama=FakeLlama))
    return FakeLlama


def test_the_llamacpp_arm_decodes_greedily_from_a_cleared_cache_until_its_limit(fake_llama: type[FakeLlama]) -> None:
    arm = llamacpp.llamacpp_arm(Path("model.gguf"), threads=2)
    (llm,) = fake_llama.made
    assert llm.options["n_threads"] == llm.options["n_threads_batch"] == 2
    assert arm([1, 2, 10], 5).tokens == [11, 12, 13, 14, 15]
    assert arm([1, 95], 50).tokens == [96, 97, 98, 99]  # its end-of-text token ends the output, kept
    assert llm.resets == 2
    assert all(s["top_k"] == 1 and s["temp"] == 0.0 and s["repeat_penalty"] == 1.0 for s in llm.settings)


def test_a_missing_llamacpp_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import raises ImportError
    with pytest.raises(SpecDecError, match="llama-cpp-python"):
        llamacpp.llamacpp_arm(Path("model.gguf"), threads=1)


def _row(arms: dict[str, tuple[int, float]], verdicts: dict[str, str]) -> dict[str, Any]:
    return {"arms": {name: {"tokens": list(range(n)), "seconds": s, "steps": None} for name, (n, s) in arms.items()},
            "verdicts": verdicts}


def test_the_summary_is_mean_tokens_per_second_over_prompts_and_its_ratios() -> None:
    rows = [
        _row({llamacpp.LLAMA: (100, 2.0), "run:none": (100, 1.0), "hf": (100, 4.0)}, {"run:none vs hf": "identical"}),
        _row({llamacpp.LLAMA: (60, 1.0), "run:none": (50, 0.5), "hf": (40, 2.0)}, {"run:none vs hf": "differs"}),
    ]
    summary = llamacpp.summary(rows)
    assert summary[llamacpp.LLAMA]["tokens_per_s"] == 55.0  # (50 + 60) / 2
    assert summary["run:none"]["tokens_per_s"] == 100.0
    assert summary["run:none"]["vs_llamacpp"] == round(100 / 55, 3)
    assert summary["hf"]["vs_hf"] == 1.0
    text = llamacpp.report({"gguf": "m.gguf", "threads": 2, "max_new_tokens": 128, "prompts": rows,
                            "summary": summary})  # fmt: skip
    assert "run:none vs hf: 1/2 identical" in text and "prompt 1: differs" in text


@pytest.mark.parametrize(("ours", "theirs", "expected"), [
    ([1, 2, 3], [1, 2, 3], "identical"),
    ([1, 2, 3], [1, 5, 3], "differs from token 1 (3 vs 3 tokens)"),
    ([1, 2], [1, 2, 3], "differs from token 2 (2 vs 3 tokens)"),
])  # fmt: skip
def test_first_difference(ours: list[int], theirs: list[int], expected: str) -> None:
    assert llamacpp._first_difference(ours, theirs) == expected


def test_the_measurement_runs_on_its_threads_and_restores_torchs(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []

    def failing(*args: object) -> None:
        seen.append(torch.get_num_threads())
        raise RuntimeError("a failed arm")

    monkeypatch.setattr(llamacpp, "_measure", failing)
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError, match="a failed arm"):
        llamacpp.measure(None, None, Path("model.gguf"), threads=before + 1)
    assert seen == [before + 1] and torch.get_num_threads() == before
