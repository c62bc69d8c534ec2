"""The soak (specdec.bench.soak) in short: one Generator over 60 prompts of a tiny fp64 model, every check on.

The full soak (``specdec bench soak``: 500+ prompts of the default model) is a benchmark, its figures in
docs/benchmarks.md "Soak". Here: identity against plain decoding (greedy and seeded sampling) for every
drafter in rotation, the shared store within its budget, RSS growth within the bound; and each check
shown able to fail (a generator that changes a token, a store over the budget, a growing RSS).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from tiny_models import VOCAB, tiny_model

from specdec.bench import soak
from specdec.datastores.shared_store import SharedStore

PROMPTS = 60
WARMUP = 10
STORE_TOKENS = 256  # ~20 outputs' worth: the store evicts many times over 60 prompts


def soak_prompts(count: int, seed: int = 0) -> list[tuple[str, list[int]]]:
    """Random prompts, short and long, most with a repeated stretch (lookup drafters find it)."""
    rng = random.Random(seed)
    prompts = []
    for i in range(count):
        prompt = [rng.randrange(2, VOCAB) for _ in range(rng.choice((3, 12, 60)))]
        if i % 4 != 3:
            prompt += prompt[: rng.randrange(2, 12)]
        prompts.append((f"random:{len(prompt)}", prompt))
    return prompts


def early_eos(model: Any, prompts: list[tuple[str, list[int]]]) -> int:
    """A token the model produces early after the first prompt: as eos_token_id it ends some outputs early."""
    from specdec.testing import plain_continuation

    return plain_continuation(model, prompts[0][1], 3)[2]


def run_soak(count: int, warmup: int, **options: Any) -> soak.SoakReport:
    model = tiny_model("llama")
    prompts = soak_prompts(count)
    cases = soak.build_cases(prompts, new_tokens=(8, 24, 40), stops=(), eos_every=4,
                             eos_token_id=early_eos(model, prompts))
    # budget="full": under "auto" whether a tiny model's steps draft depends on measured costs (a busy
    # machine declines them all), and the identity checked here is worth something only if drafts were taken.
    return soak.soak(model, None, cases, warmup=warmup, budget="full", progress=False, **options)


def test_soak_on_a_tiny_model_is_identical_within_budget_and_flat(tmp_path: Path) -> None:
    report = run_soak(PROMPTS, WARMUP, store=STORE_TOKENS, rss_growth_mb=soak.DEFAULT_RSS_GROWTH_MB)
    assert report.problems() == []
    assert len(report.rows) == PROMPTS and report.identical == PROMPTS  # fp64: no near-tie is tolerated
    assert {row.drafter for row in report.rows} == set(soak.DRAFTERS)
    assert {row.mode == "greedy" for row in report.rows} == {True, False}
    assert any(row.stop_reason == "eos" and row.new_tokens < 8 for row in report.rows)  # early ends happened
    drafted = sum(row.accepted for row in report.rows if row.drafter != "none")
    assert drafted > 0 and all(row.accepted == 0 for row in report.rows if row.drafter == "none")
    assert 0 < report.store_max <= STORE_TOKENS and report.evicted_tokens > 0  # within budget by evicting
    growth = report.rss_growth_mb
    assert growth is not None and growth <= soak.DEFAULT_RSS_GROWTH_MB
    text = soak.format_report(report, "test")
    assert "**passed**" in text and "| sam+recycling | greedy |" in text
    assert soak.plot_rss(report, tmp_path / "rss.png").stat().st_size > 0


class TamperingGenerator(soak.Generator):
    """The soaked generator (the one drafting) changes its output's last token: a lossy decoder."""

    def generate(self, prompt: Any, **options: Any) -> Any:
        result = super().generate(prompt, **options)
        if isinstance(self._drafters.spec, soak.RotatingFactory) and result.tokens:
            result.tokens[-1] = (result.tokens[-1] + 1) % VOCAB
        return result


def test_soak_reports_a_changed_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(soak, "Generator", TamperingGenerator)
    report = run_soak(10, 4)
    assert len(report.failures) == 10
    greedy = [row for row in report.failures if row.mode == "greedy"]
    assert greedy and all(row.verdict.startswith("DIFFERENT: ") for row in greedy)
    assert any("prompt 0 " in problem for problem in report.problems())


def test_soak_reports_a_store_over_its_budget() -> None:
    report = run_soak(10, 4, store=SharedStore(100_000), store_budget=16)
    assert report.failures == []
    assert any("over its budget of 16" in problem for problem in report.problems())


def test_soak_reports_rss_growth_after_the_warm_up() -> None:
    readings = iter(range(1000, 2000, 4))  # 4 MiB more after every prompt
    report = run_soak(12, 4, rss=lambda: float(next(readings)), rss_growth_mb=16.0)
    assert report.rss_growth_mb == pytest.approx(4.0 * 8)
    assert [p for p in report.problems() if p.startswith("RSS grew 32.0 MiB")]
    flat = run_soak(12, 4, rss=lambda: 1000.0, rss_growth_mb=16.0)
    assert flat.problems() == []


def test_soak_with_batches_and_two_threads_on_one_generator() -> None:
    """Two threads call the one generator (its lock takes turns) while each thread's plain reference runs
    beside the other's generation; every third greedy prompt is decoded in a batch of two. All identical."""
    report = run_soak(24, 6, threads=2, batch_every=3)
    assert report.problems() == [] and report.identical == 24
    assert sorted(row.index for row in report.rows) == list(range(24))
    assert report.batches == sum(row.mode.endswith("batch of 2") for row in report.rows) > 0
    summary = report.summary()
    assert summary["threads"] == 2 and summary["batch_every"] == 3 and summary["engine"] == "specdec"
    assert "commit" in summary


class TamperingBatchGenerator(soak.Generator):
    """The soaked generator changes the last token of a batch's second row only."""

    def generate_batch(self, prompts: Any, **options: Any) -> Any:
        results = super().generate_batch(prompts, **options)
        if isinstance(self._drafters.spec, soak.RotatingFactory) and results[1].tokens:
            results[1].tokens[-1] = (results[1].tokens[-1] + 1) % VOCAB
        return results


def test_soak_reports_a_changed_token_in_a_batch_row(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(soak, "Generator", TamperingBatchGenerator)
    report = run_soak(12, 4, batch_every=2)
    batched = [row for row in report.rows if row.mode.endswith("batch of 2")]
    assert batched and {row.index for row in report.failures} == {row.index for row in batched}
    assert all(row.verdict.startswith("DIFFERENT: ") for row in report.failures)


def test_with_threads_the_rss_rule_reads_the_floor_so_a_coincidence_passes_and_a_leak_fails() -> None:
    """Beside a second thread a reading may hold the other generation's live memory: one spike of 200 MiB
    every seventh prompt passes the rule with two threads (it would fail with one), while a steady leak of
    4 MiB a prompt fails with two threads as with one."""
    spiky = iter([1000.0 + (200.0 if i % 7 == 6 else 0.0) for i in range(100)])
    two = run_soak(40, 10, threads=2, rss=lambda: next(spiky), rss_growth_mb=16.0)
    assert two.rss_growth_mb == pytest.approx(0.0) and two.problems() == []
    spiky = iter([1000.0 + (200.0 if i % 7 == 6 else 0.0) for i in range(100)])
    one = run_soak(40, 10, threads=1, rss=lambda: next(spiky), rss_growth_mb=16.0)
    assert one.rss_growth_mb == pytest.approx(200.0) and one.problems() != []
    leaking = iter(range(1000, 2000, 4))
    leak = run_soak(40, 10, threads=2, rss=lambda: float(next(leaking)), rss_growth_mb=16.0)
    assert leak.rss_growth_mb is not None and leak.rss_growth_mb > 100  # ~4 MiB x 30 (rows out of turn)
    assert [p for p in leak.problems() if p.startswith("RSS grew")]


def test_a_reading_is_taken_after_the_allocator_hands_back_free_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(soak, "release_free_memory", lambda: calls.append(1) or True)
    assert soak.rss_mb() > 0 and calls == [1]
