"""`specdec demo` and `specdec cold-start`: their prompts, the statement of where speculation does not pay
(from synthetic measurements), the cold-start summary, and both commands end to end on the default model
(slow: a few tokens per prompt, so they show the commands work, not how fast they are)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from specdec.commands import main
from specdec.commands.coldstart import coldstart_prompts, summarize
from specdec.commands.demo import EXPLAIN_SIZES, demo_prompts, drafted_share, explain
from specdec.types import GenerationResult, GenerationStats, StepRecord

KINDS = ["code edit", "summary", "question + context", "chat"]


def result(steps: list[tuple[int, int]]) -> GenerationResult:
    """A run whose steps verified ``tree_size`` nodes and accepted ``accepted`` draft tokens each."""
    emitted = sum(a + 1 for _, a in steps)
    stats = GenerationStats(steps=len(steps), emitted_by_steps=emitted, new_tokens=emitted + 1)
    stats.records = [StepRecord(size, accepted, "pld", 0.0, 0.0) for size, accepted in steps]
    return GenerationResult(tokens=[], stats=stats, prompt_tokens=[])


def test_the_demo_prompts_are_one_of_each_kind_and_short() -> None:
    prompts = demo_prompts()
    assert [p.kind for p in prompts] == KINDS
    assert sum(p.max_new_tokens for p in prompts) <= 200  # the demo's time budget on a 2-core CPU
    assert all(p.prompt.strip() for p in prompts)


def test_drafted_share() -> None:
    assert drafted_share(result([(1, 0), (5, 2), (3, 0), (1, 0)])) == (0.5, 2 / 6)
    assert drafted_share(result([])) == (0.0, 0.0)


def test_the_statement_names_where_speculation_does_not_pay_and_why() -> None:
    chat = result([(1, 0)] * 14 + [(4, 0), (4, 1), (3, 0)] * 2)  # 6 of 20 steps drafted, 2 of 16 draft tokens right
    good = result([(4, 3)] * 10)
    speedups = {"pld": [1.8, 1.4, 1.3, 1.02], "sam+recycling": [1.7, 1.5, 1.2, 0.97]}
    results = {"pld": [good, good, good, chat], "sam+recycling": [good, good, good, chat]}
    ratios = dict(zip(EXPLAIN_SIZES, (0.9, 1.0, 1.4, 1.9), strict=True))
    lines = explain(KINDS, speedups, results, ratios, "cpu:X, float32")
    assert lines[0] == ("On this device (cpu:X, float32) verifying a draft costs, next to a plain step: "
                        "2 tokens 0.90x, 4 tokens 1.00x, 8 tokens 1.40x, 16 tokens 1.90x (this machine's cost model, "
                        "learned from its own steps and this run's).")
    (chat_line,) = [line for line in lines if "does not pay" in line]
    assert chat_line.startswith("Speculation does not pay on the chat prompt here (pld 1.02x, sam+recycling 0.97x)")
    assert "its drafts were seldom right (pld: 12% of the verified draft tokens accepted, MAT 1.10)" in chat_line
    assert "a draft of 8 tokens costs 1.4x a plain step here, so budget='auto' verified a draft on only 30%" in (
        chat_line
    )
    assert "too few" not in chat_line
    assert "datacenter GPU" in lines[-1]
    assert not any("summary prompt" in line for line in lines)  # it paid


def test_the_statement_follows_what_was_measured() -> None:
    right = result([(1, 0)] * 3 + [(3, 2)])  # drafts right, but rare; a short answer
    lines = explain(["chat"], {"pld": [0.9]}, {"pld": [right]}, None, "cpu")
    assert lines == ["Speculation does not pay on the chat prompt here (pld 0.90x): its drafts were often right "
                     "(pld: 100% accepted, MAT 1.50), but few steps had one; 7 new tokens are too few for any gain "
                     "to show over the prefill."]


def test_the_statement_when_everything_pays_or_verification_is_cheap() -> None:
    good = result([(4, 3)] * 10)
    speedups = {"pld": [1.8, 1.4, 1.3, 1.2]}
    flat = dict.fromkeys(EXPLAIN_SIZES, 1.0)
    lines = explain(KINDS, speedups, {"pld": [good] * 4}, flat, "cuda:H100, bfloat16")
    assert lines[1] == "Speculation paid on every prompt here (each method at 1.10x or more)."
    assert len(lines) == 2  # nothing about costly verification where it is not
    mixed = {"pld": [1.8, 1.4, 1.3, 1.05], "sam": [1.8, 1.4, 1.3, 1.2]}  # one method paid on chat: it pays
    assert explain(KINDS, mixed, {"pld": [good] * 4, "sam": [good] * 4}, None, "cpu") == [
        "Speculation paid on every prompt here (on each, a method at 1.10x or more)."]  # not "each method"


def test_the_coldstart_prompts() -> None:
    warm, test = coldstart_prompts()
    assert len(test) == 12 and len(warm) == 3
    assert {p["kind"] for p in test} == {"code", "math", "summary"}
    assert not {p["prompt"] for p in warm} & {p["prompt"] for p in test}  # held out


def test_the_coldstart_summary() -> None:
    def arm(rate: float, tokens: list[int]) -> dict[str, Any]:
        return {"tokens_per_s": rate, "mat": 1.5, "tokens": tokens}

    rows = [
        {"plain": arm(10.0, [1]), "warm": arm(15.0, [1]), "cold": arm(14.0, [1]), "cold-fresh": arm(11.0, [1])},
        {"plain": arm(20.0, [2]), "warm": arm(27.0, [2]), "cold": arm(27.5, [3]), "cold-fresh": arm(21.0, [2])},
    ]
    summary = summarize(rows)
    assert summary["arms"]["warm"]["speedup"] == pytest.approx(42 / 30, abs=1e-4)  # mean over mean
    assert summary["arms"]["cold"]["speedup"] == pytest.approx(41.5 / 30, abs=1e-4)
    assert summary["arms"]["cold"]["identical"] == 1
    assert summary["cold_over_warm"] == pytest.approx(41.5 / 42, abs=1e-4)
    assert summary["cold_within_5pct_of_warm"] and summary["cold_at_least_1_2x"]
    assert not summarize([{**rows[0], "cold": arm(11.0, [1])}])["cold_within_5pct_of_warm"]


@pytest.mark.slow
def test_the_demo_runs_on_the_default_model(default_model: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--max-new-tokens", "6", "--no-planner-cache"]) == 0
    out = capsys.readouterr()
    for kind in KINDS:
        assert f"[{kind}]" in out.out  # its answer
    table = out.out[out.out.index("prompt "):]
    assert all(kind in table for kind in [*KINDS, "overall"]) and "8/8" in table  # every output identical
    assert "verifying a draft costs, next to a plain step" in out.out
    assert "Model and verifiers ready in" in out.err and "One-time costs paid in" in out.err  # what took how long
    assert "Speculation" in out.out
    for method in ("none", "pld", "sam+recycling"):
        assert f"{method} " in out.err and "4/4" in out.err  # the progress line names every method
    assert "engine 'specdec' (auto: a CPU and a Llama-family model" in out.err  # which path, and why


def test_auto_engine_says_why() -> None:
    from tiny_models import tiny_model

    from specdec.backends import auto_engine, auto_engine_reason

    cpu = torch.device("cpu")
    llama, gpt2 = tiny_model("llama"), tiny_model("gpt2")
    assert auto_engine(llama, cpu) == "specdec" and "Llama-family" in auto_engine_reason(llama, cpu)
    assert auto_engine(gpt2, cpu) == "hf" and "'gpt2'" in auto_engine_reason(gpt2, cpu)
    assert "CUDA graphs" in auto_engine_reason(llama, torch.device("cuda"))


@pytest.mark.slow
def test_the_coldstart_command_runs_in_fresh_processes(
    default_model: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The suite runs with SPECDEC_PLANNER_CACHE=0 (conftest): the command turns it on where an arm needs it.
    out = tmp_path / "coldstart.json"
    assert main(["cold-start", "--prompts", "1", "--warm-prompts", "1", "--max-new-tokens", "8",
                 "--skip", "cold-fresh", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    (row,) = report["rows"]
    assert set(row) == {"kind", "plain", "warm", "cold"}
    assert row["cold"]["tokens"] == row["plain"]["tokens"] == row["warm"]["tokens"]
    assert row["cold"]["tokens_per_s"] > 0.0 and "cold_over_warm" in report["summary"]
    assert "cold / warm =" in capsys.readouterr().out


def test_plain_decoding_runs_the_calibrated_kernels_in_the_demo(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A table measured after the generators exist (`specdec calibrate` in another process) is taken by the
    warm-up, which measures nothing itself: the plain baseline takes its kernel choice too, or every speedup
    the demo prints compares other kernels."""
    import copy

    import torch
    from tiny_models import tiny_model

    import specdec
    from specdec.backends import make_verifier
    from specdec.budget.calibration_cache import cost_model, forget_cost_models
    from specdec.commands.demo import DemoPrompt, _warm_up
    from specdec.types import KernelChoice

    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr("specdec.budget.calibration_cache.busy_reason", lambda table: None)
    forget_cost_models()
    model = copy.deepcopy(tiny_model("llama")).to(torch.float32)
    cpu_single = KernelChoice(((1, "cpu"),))  # say specdec's CPU kernels win at one node only
    monkeypatch.setattr("specdec.budget.calibration.choose_kernels", lambda sizes, seconds: cpu_single)
    generators = {name: specdec.Generator(model, drafter=name, engine="specdec") for name in ("none", "pld")}
    assert generators["none"].verifier.kernels != cpu_single  # nothing measured yet: the verifier's own
    cost_model(make_verifier(model, "specdec"), measure=True)  # `specdec calibrate`, as another process would
    forget_cost_models()
    capsys.readouterr()
    prompt = [5, 6, 7, 5, 6, 7, 5]
    _warm_up(generators, [DemoPrompt("chat", prompt, 8)], [prompt])  # type: ignore[arg-type]  # ids, no tokenizer
    assert generators["none"].verifier.kernels == generators["pld"].verifier.kernels == cpu_single
    assert "measuring" not in capsys.readouterr().err  # the warm-up read the table: it timed nothing
    forget_cost_models()
