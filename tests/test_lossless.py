"""Speculative output equals plain greedy decoding, token for token, on tiny fp64 models.

Plain greedy decoding is checked two ways: Hugging Face's own ``model.generate`` and
specdec's ``none`` drafter (one-node trees through the same loop). In fp64 no rounding
difference can flip a choice, so identity is demanded with no tie tolerance.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from conftest import IDENTITY_COUNTS
from oracle_drafter import OracleTreeDrafter
from tiny_models import ARCHITECTURES, VOCAB, tiny_model

import specdec
from specdec.budget.acceptance import AcceptanceModel
from specdec.budget.cost_model import CostTable, VerifyCostModel
from specdec.budget.planner import BudgetPlanner, Throughput
from specdec.engine import decode

DRAFTERS = ["none", "pld"]
PROMPTS_PER_CASE = 4


def random_prompt(rng: random.Random) -> list[int]:
    """Random tokens, often with a repeated stretch so that lookup drafters find matches."""
    prompt = [rng.randrange(VOCAB) for _ in range(rng.randrange(2, 40))]
    if rng.random() < 0.7:
        start = rng.randrange(len(prompt))
        prompt += prompt[start : start + rng.randrange(2, 12)] + [rng.randrange(VOCAB) for _ in range(3)]
    return prompt


def hf_greedy(model: torch.nn.Module, prompt: list[int], max_new_tokens: int) -> list[int]:
    # An explicit all-ones mask: otherwise generate masks prompt tokens equal to the pad id.
    ids = torch.tensor([prompt], device=next(model.parameters()).device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False)
    return [int(t) for t in out[0, len(prompt) :]]


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_drafters_match_plain_greedy(arch: str, drafter: str) -> None:
    model = tiny_model(arch)
    rng = random.Random(f"{arch}-{drafter}")
    accepted = 0
    for _ in range(PROMPTS_PER_CASE):
        prompt = random_prompt(rng)
        max_new = rng.randrange(1, 60)
        expected = hf_greedy(model, prompt, max_new)
        # A fixed budget: under "auto" whether a step drafts depends on timings, and this test proves drafts were taken.
        result = specdec.run(model, prompt, drafter, max_new_tokens=max_new, budget="full")
        assert result.tokens == expected, f"{arch}/{drafter}: prompt {prompt}"
        assert result.stats.new_tokens == max_new
        IDENTITY_COUNTS[f"{arch}/{drafter}"] += 1
        accepted += sum(r.accepted for r in result.stats.records)
    if drafter == "none":
        assert accepted == 0  # one-node trees: nothing drafted
    else:  # the identity above is worth something only if drafts were taken (prompts built to repeat)
        assert accepted > 0, f"{arch}/{drafter}: no draft token was accepted"


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_none_is_exactly_autoregressive(arch: str) -> None:
    model = tiny_model(arch)
    result = specdec.run(model, [3, 1, 4, 1, 5, 9, 2, 6], "none", max_new_tokens=30)
    assert result.tokens == hf_greedy(model, [3, 1, 4, 1, 5, 9, 2, 6], 30)
    assert result.stats.mat == 1.0
    assert result.stats.steps == 29  # the prefill decides the first token
    assert result.stats.mean_tree_size == 1.0


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_random_trees_around_the_truth(arch: str, attn: str) -> None:
    """Deep accepted paths and scattered slots: the oracle hides the truth in random trees."""
    model = tiny_model(arch, attn)
    rng = random.Random(arch)
    accepted_total = 0
    for seed in range(3):
        prompt = random_prompt(rng)
        truth = hf_greedy(model, prompt, 50)
        drafter = OracleTreeDrafter(truth, VOCAB, seed=seed, size=20, depth=7)
        # The whole tree, as drafted: this test is about verification, not about budgets.
        result = specdec.run(model, prompt, drafter, max_new_tokens=50, budget="full")
        assert result.tokens == truth
        IDENTITY_COUNTS[f"{arch}/oracle-tree/{attn}"] += 1
        accepted_total += sum(r.accepted for r in result.stats.records)
    assert accepted_total > 20  # regression guard: the oracle's drafts really were accepted


def test_max_nodes_caps_every_tree() -> None:
    model = tiny_model("llama")
    truth = hf_greedy(model, [5, 6, 7], 40)
    result = specdec.run(model, [5, 6, 7], OracleTreeDrafter(truth, VOCAB, size=30), max_new_tokens=40, max_nodes=4)
    assert result.tokens == truth
    assert max(r.tree_size for r in result.stats.records) <= 4


# budget="auto" without the clock: the planner prices trees with a frozen cost table (learn=False) and counts
# each step's time as that table's prediction plus a fixed overhead (Throughput(fixed_overhead_s=0)), so whether
# a step drafts depends on the table and the acceptance statistics only, never on how busy the machine is.
CHEAP = (0.010, 0.010, 0.010, 0.010, 0.011)  # seconds for 1, 2, 8, 32, 128 nodes: drafting always pays
DEAR = (0.010, 1.0, 4.0, 16.0, 64.0)  # a draft token costs ~100x a plain step: no draft can pay


def frozen_cost(seconds: tuple[float, ...]) -> VerifyCostModel:
    table = CostTable((1, 2, 8, 32, 128), (0, 4096), (seconds, seconds), {"device": "test"})
    return VerifyCostModel(table, learn=False)


def auto_run(generator: specdec.Generator, prompt: list[int], max_new: int, seconds: tuple[float, ...]) -> Any:
    """One generation of ``generator``'s drafter under budget="auto" priced by ``seconds``, clock-free."""
    planner = BudgetPlanner(generator.verifier, "auto", AcceptanceModel(), Throughput(fixed_overhead_s=0.0),
                            cost=frozen_cost(seconds))
    config = generator.decoding_config(max_new_tokens=max_new, budget="auto")
    return decode(generator.verifier, generator.new_drafter(), prompt, config, planner=planner)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("drafter", ["pld", "sam+recycling"])
def test_auto_budget_drafts_when_verification_is_cheap(arch: str, drafter: str) -> None:
    """Cheap verification: budget="auto" must draft and accept (prompts built to repeat), output = plain greedy."""
    model = tiny_model(arch)
    generator = specdec.Generator(model, drafter=drafter, planner_cache=False)
    rng = random.Random(f"auto-{arch}-{drafter}")
    accepted = drafted = 0
    for _ in range(PROMPTS_PER_CASE):
        prompt = random_prompt(rng)
        prompt += prompt  # the whole prompt again: lookup drafters find it, so some draft is accepted
        result = auto_run(generator, prompt, 40, CHEAP)
        assert result.tokens == hf_greedy(model, prompt, 40), f"{arch}/{drafter}: prompt {prompt}"
        again = auto_run(generator, prompt, 40, CHEAP)  # the same decisions: nothing read a clock
        assert [(r.tree_size, r.reason) for r in again.stats.records] == \
            [(r.tree_size, r.reason) for r in result.stats.records]
        assert {r.reason for r in result.stats.records} <= {"no draft", "auto", "probe"}
        drafted += sum(r.tree_size > 1 for r in result.stats.records)
        accepted += sum(r.accepted for r in result.stats.records)
    assert drafted > 0 and accepted > 0, f"{arch}/{drafter}: budget='auto' drafted {drafted}, accepted {accepted}"


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("drafter", ["pld", "sam+recycling"])
def test_auto_budget_drafts_nothing_when_verification_is_dear(arch: str, drafter: str) -> None:
    """Dear verification: every offered draft is declined, and the probes' time budget buys none."""
    model = tiny_model(arch)
    generator = specdec.Generator(model, drafter=drafter, planner_cache=False)
    rng = random.Random(f"auto-{arch}-{drafter}")
    declined = 0
    for _ in range(PROMPTS_PER_CASE):
        prompt = random_prompt(rng)
        prompt += prompt
        result = auto_run(generator, prompt, 40, DEAR)
        assert result.tokens == hf_greedy(model, prompt, 40), f"{arch}/{drafter}: prompt {prompt}"
        records = result.stats.records
        # Probes are on a time budget: a declined step earns 3% of its 10 ms toward a probe that
        # adds 990 ms, so one would come after ~3300 declined steps: none here.
        assert all(r.tree_size == 1 and r.reason in ("no draft", "declined") for r in records)
        declined += sum(r.reason == "declined" for r in records)
    assert declined > 0, f"{arch}/{drafter}: no draft was offered, so the test decided nothing"
