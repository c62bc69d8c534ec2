"""Token identity on the default model (SmolLM2-135M-Instruct, fp32) with Spec-Bench prompts.

In fp32 a tree forward and one-token forwards round differently (~1e-5), so against
Hugging Face's ``generate`` a test passes on identity, or on a first difference whose
top-two logit margin is under 1e-3 (a near-tie), and says which it was.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import IDENTITY_COUNTS

import specdec
from specdec.cachefiles import folder
from specdec.testing import compare_outputs
from specdec.types import KernelChoice

# This session's converted model and built kernels, where they were before any fixture moved the cache:
# child processes of a test reuse them (a fresh conversion or build would take minutes).
SESSION_FOLDERS = {name: folder(name) for name in ("models", "extensions")}

pytestmark = pytest.mark.slow

MAX_NEW = 48
DRAFTERS = ["none", "pld"]


@pytest.fixture(scope="module")
def reference_outputs(default_model: tuple[Any, Any], spec_bench_prompts: dict[str, list[list[int]]]) -> dict[str, Any]:
    model, _ = default_model
    outputs = {}
    for category, prompts in sorted(spec_bench_prompts.items()):
        prompt = prompts[1]
        ids = torch.tensor([prompt])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW, do_sample=False)
        outputs[category] = (prompt, [int(t) for t in out[0, len(prompt) :]])
    return outputs


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_default_model_matches_generate(
    default_model: tuple[Any, Any], reference_outputs: dict[str, Any], drafter: str
) -> None:
    model, tokenizer = default_model
    report, accepted = [], 0
    for category, (prompt, expected) in reference_outputs.items():
        # A fixed budget: whether "auto" drafts depends on timings (test_budget_default_model.py covers it).
        result = specdec.run(model, prompt, drafter, tokenizer=tokenizer, max_new_tokens=MAX_NEW, budget="full")
        accepted += sum(r.accepted for r in result.stats.records)
        comparison = compare_outputs(model, prompt, result.tokens, expected)
        report.append(f"{category}: {comparison.describe()}")
        assert comparison.acceptable, f"{drafter} on {category}: {comparison.describe()}"
        if comparison.identical:
            IDENTITY_COUNTS[f"smollm2/{drafter}"] += 1
        else:
            IDENTITY_COUNTS[f"smollm2/{drafter} (near-tie)"] += 1
    # Speculation happened (not on every prompt of every category: summed).
    assert accepted > 0 if drafter != "none" else accepted == 0, f"{drafter}: {accepted} draft tokens accepted"
    print(f"\n{drafter} vs generate: " + "; ".join(report))


@pytest.mark.parametrize("kernels", ["default", "cpu", "cpu-attention", "cpu-blocks"])
def test_default_model_native_path_matches_generate(
    default_model: tuple[Any, Any], reference_outputs: dict[str, Any], kernels: str
) -> None:
    """specdec's own forward (engine="specdec") with each kernel variant on every step, one-node steps included."""
    model, tokenizer = default_model
    report, trees, single, accepted = [], 0, 0, 0
    for category, (prompt, expected) in reference_outputs.items():
        generator = specdec.Generator(model, tokenizer, drafter="pld", budget="full", engine="specdec")
        generator.verifier.use_kernels(KernelChoice.uniform(kernels))
        result = generator.generate(prompt, max_new_tokens=MAX_NEW)
        assert result.stats.engine == "specdec"
        accepted += sum(r.accepted for r in result.stats.records)
        trees += sum(r.tree_size > 1 for r in result.stats.records)
        single += sum(r.tree_size == 1 for r in result.stats.records)
        comparison = compare_outputs(model, prompt, result.tokens, expected)
        report.append(f"{category}: {comparison.describe()}")
        assert comparison.acceptable, f"native {kernels} pld on {category}: {comparison.describe()}"
        IDENTITY_COUNTS[f"smollm2/pld native {kernels}" + ("" if comparison.identical else " (near-tie)")] += 1
    assert not any("forward" in m.__dict__ for m in model.modules())  # the user's model is never changed
    assert trees > 0 and single > 0 and accepted > 0
    print(f"\nnative {kernels} pld vs generate: " + "; ".join(report))


def test_text_prompt_and_chat_template(default_model: tuple[Any, Any]) -> None:
    model, tokenizer = default_model
    result = specdec.run(model, "Name three colors.", "pld", tokenizer=tokenizer, max_new_tokens=16)
    assert result.text is not None and result.text.strip()
    assert result.text == tokenizer.decode(result.tokens, skip_special_tokens=True)
    # The chat template was applied: the prompt starts with the template's first tokens.
    templated = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name three colors."}], add_generation_prompt=True, tokenize=True
    )
    templated = templated["input_ids"] if hasattr(templated, "keys") else templated
    assert result.prompt_tokens == list(templated)
    raw = specdec.run(model, "Name three colors.", "pld", tokenizer=tokenizer, max_new_tokens=4, chat_template=False)
    assert raw.prompt_tokens == tokenizer("Name three colors.")["input_ids"]


def test_eos_ends_a_chat_answer(default_model: tuple[Any, Any]) -> None:
    model, tokenizer = default_model
    result = specdec.run(model, "Reply with just the word yes.", "pld", tokenizer=tokenizer, max_new_tokens=64)
    assert result.stats.stop_reason == "eos"
    assert result.tokens[-1] == tokenizer.eos_token_id


def test_generate_command_streams_plain_decodings_text(
    default_model: tuple[Any, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """``specdec generate`` end to end: the streamed text is plain decoding's, the stats JSON on stderr."""
    import json

    from specdec.commands import main

    model, tokenizer = default_model
    prompt = "Repeat this line twice: the quick brown fox jumps over the lazy dog."
    plain = specdec.run(model, prompt, "none", tokenizer=tokenizer, max_new_tokens=32)
    assert main(["generate", prompt, "--drafter", "pld", "--max-new-tokens", "32", "--budget", "full", "--json"]) == 0
    out, err = capsys.readouterr()
    stats = json.loads(err.strip().splitlines()[-1])
    assert out == plain.text + "\n"
    assert stats["new_tokens"] == len(plain.tokens) and stats["stop_reason"] == plain.stats.stop_reason
    assert stats["mat"] > 1.0  # the repeated line was drafted
    assert main(["generate", prompt, "--max-new-tokens", "32", "--quiet", "--stop", "fox"]) == 0
    quiet = capsys.readouterr().out
    assert quiet.rstrip("\n").endswith("fox") and plain.text.startswith(quiet.rstrip("\n"))


@pytest.mark.parametrize("sampled", [False, True])
def test_default_model_batch_rows_equal_their_lone_plain_decoding(
    default_model: tuple[Any, Any], spec_bench_prompts: dict[str, list[list[int]]], sampled: bool
) -> None:
    """A batch (``sam+recycling``, ragged prompts, one place fewer than prompts: a row joins mid-batch) gives every
    row its own ``run(drafter="none")`` tokens; a difference must sit on a near-tie, and the report says."""
    model, tokenizer = default_model
    prompts = [prompts[2] for _, prompts in sorted(spec_bench_prompts.items())][: 3 if sampled else 4]
    options: dict[str, Any] = {"max_new_tokens": 32}  # fewer than MAX_NEW: CI's 30 minutes
    if sampled:
        options.update(do_sample=True, temperature=0.8, top_p=0.95, seed=7)
    generator = specdec.Generator(model, tokenizer, drafter="sam+recycling", budget="full")
    results = generator.generate_batch(prompts, batch_size=len(prompts) - 1, **options)
    report, drafted = [], 0
    for i, (prompt, result) in enumerate(zip(prompts, results, strict=True)):
        lone_options = {**options, "seed": 7 + i} if sampled else options
        lone = specdec.run(model, prompt, "none", tokenizer=tokenizer, **lone_options)
        assert result.stats.engine == lone.stats.engine == "specdec"
        drafted += result.stats.emitted_by_steps - result.stats.steps
        comparison = compare_outputs(model, prompt, result.tokens, lone.tokens)
        report.append(f"row {i}: {comparison.describe()}")
        assert comparison.acceptable, f"batch row {i}: {comparison.describe()}"
        IDENTITY_COUNTS["smollm2/batch sam+recycling" + (" sampled" if sampled else "")
                        + ("" if comparison.identical else " (near-tie)")] += 1  # fmt: skip
    assert drafted > 0  # some rows' drafts were accepted: the batch verified trees, not only single tokens
    print(f"\nbatch sam+recycling ({'sampled' if sampled else 'greedy'}) vs lone none: " + "; ".join(report))


def test_bench_batch_measures_every_arm_at_every_batch_size(default_model: tuple[Any, Any], tmp_path: Any) -> None:
    """``specdec bench batch`` on 2 held-out prompts x 16 tokens: a figure for every arm at every B, every row
    judged against its single-sequence plain decoding, the table, the ratios and the plot written."""
    from specdec.bench import batched, oneoff

    model, tokenizer = default_model
    texts = [prompt.text for prompt in oneoff.heldout_prompts()[:2]]
    specs = "none,sam+recycling=sam+recycling:budget=full,hf-generate"  # full: steps depend on no clock
    runs = batched.measure(model, tokenizer, texts, specs, [1, 2], 16, progress=False)
    arms = {(r.arm, r.batch_size) for r in runs}
    assert arms == {(a, b) for a in ("none", "sam+recycling", "hf-generate") for b in (1, 2)} | {
        ("single:none", 1), ("single:sam+recycling", 1)}
    for r in runs:
        assert len(r.rows) == 2 and r.seconds > 0 and all(0 < len(row) <= 16 for row in r.rows)
        assert r.acceptable == 2, (r.arm, r.batch_size, r.verdicts)
    steps = {(r.arm, r.batch_size): r.steps for r in runs}
    # B = 1 is the single path; each timed run starts from the same learned state (no drafting from memory)
    assert steps[("sam+recycling", 1)] == steps[("single:sam+recycling", 1)]
    none_rows = {r.batch_size: r.rows for r in runs if r.arm == "none"}
    assert none_rows[1] == none_rows[2]  # specdec's plain batch is bitwise its single-sequence decoding
    summary = batched.summarize(runs)
    assert set(summary["ratios"][2]) == {"none / hf-generate", "sam+recycling / none", "sam+recycling / hf-generate"}
    assert "sam+recycling / single:sam+recycling" in summary["ratios"][1]
    text = batched.format_summary(summary)
    assert "| 2 |" in text and "NOT at a near-tie" not in text
    assert batched.plot(summary, tmp_path / "batch.png", "test").stat().st_size > 0


def test_oneoff_arms_start_from_the_same_recycling_matrix(default_model: tuple[Any, Any], planner_cache: Any) -> None:
    """``specdec bench oneoff`` in one process: Token Recycling's matrix is shared by every arm on the model, so
    each arm must start from what the earlier prompts left, not from another arm's pass over the same output.
    With ``recycling`` at a full budget the drafts depend on the matrix and the text only: equal starting
    matrices give the ``run``, ``generator`` and ``hf_generate`` (``model.generate(..., custom_generate=)``) arms
    the same steps, a matrix taught by another arm fewer."""
    from specdec.bench import oneoff

    model, tokenizer = default_model
    prompts = oneoff.heldout_prompts()[:2]
    results = oneoff.measure_in_process(model, tokenizer, prompts, "r=recycling:budget=full", 32, progress=False,
                                        custom_generate=True)  # fmt: skip
    for result in results:
        steps = [result.arms[arm].steps for arm in ("run:r", "generator:r", "hf_generate:r")]
        assert all(result.acceptable.values()), result.verdicts  # each arm is plain greedy (or a judged near-tie)
        assert len(result.acceptable) == 3 and len(set(steps)) == 1, (result.prompt.kind, steps)


def test_oneoff_fresh_processes_and_the_warmed_process_start_from_the_same_learned_state(
    default_model: tuple[Any, Any], planner_cache: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``specdec bench oneoff --fresh``: one process per prompt, then one warmed process over the same prompts
    from a copy of the learned state the fresh sequence started from. With ``recycling`` at a full budget the
    drafts depend on the matrix and the text only, so equal learned states give each prompt equal steps in
    both sequences (a warmed process that started from the fresh sequence's end state would draft the
    prompts' outputs from memory: fewer steps). Every arm's tokens are plain greedy (or a judged near-tie)."""
    from specdec.bench import oneoff
    from specdec.cachefiles import kind

    model, _ = default_model
    for name, where in SESSION_FOLDERS.items():  # the children reuse the session's converted model and kernels
        monkeypatch.setenv(kind(name).env, str(where))
    prompts = oneoff.heldout_prompts()[:2]
    spec = "recycling:budget=full"
    results = oneoff.measure_fresh(model, prompts, spec, 24, progress=False)
    for result in results:
        assert set(result.arms) == {"hf", f"run:{spec}", f"warmed:{spec}", "hf:warmed"}
        assert all(result.acceptable.values()), result.verdicts
        assert result.arms[f"run:{spec}"].steps == result.arms[f"warmed:{spec}"].steps, result.prompt.kind
    line = oneoff.fresh_against_warmed(results, spec)
    assert line is not None and "fresh processes against the warmed process" in line
    # Where each arm's seconds went, fresh and warmed alike (the verifier ran every step of each).
    for result in results:
        for arm in (f"run:{spec}", f"warmed:{spec}"):
            timing = result.arms[arm]
            assert timing.split is not None and timing.engine, arm
            assert 0 < timing.split["verify_s"] < timing.seconds and timing.split["nodes"] >= 1, (arm, timing.split)
    assert "per prompt, fresh vs warmed: outside the generation" in line, line
    # Without the warmed arms (``--fresh`` with ``warmed=False``) there is nothing to set the fresh ones against.
    alone = [oneoff.PromptResult(r.prompt, r.ids, {arm: t for arm, t in r.arms.items() if "warmed" not in arm})
             for r in results]  # fmt: skip
    assert oneoff.fresh_against_warmed(alone, spec) is None
