"""Narrow products (``specdec.backends.narrow``): the same math as ``linear``, scoped to one forward.

Checked: the product itself against ``torch.nn.functional.linear`` (random shapes, with
and without bias, 2D and 3D inputs); the switch installs on plain ``Linear`` layers only
and always comes off, an exception included; whole generations with every multi-node
verification narrow are token-identical to plain greedy decoding on the tiny fp64 models;
and calibration's choice of ``narrow_rows`` (the rule, the table, the verifier it sets).
"""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
import torch
from conftest import IDENTITY_COUNTS
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle_drafter import OracleTreeDrafter
from test_lossless import hf_greedy, random_prompt
from tiny_models import ARCHITECTURES, VOCAB, tiny_model

import specdec
from specdec.backends import make_verifier
from specdec.backends.narrow import NarrowLinears, narrow_linear, supports_narrow
from specdec.budget.cost import CostTable, _narrow_threshold, calibrate, cost_model, forget_cost_models


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 70),
    lead=st.sampled_from([(), (1,), (2,)]),
    fan_in=st.integers(1, 40),
    fan_out=st.integers(1, 40),
    bias=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_narrow_linear_is_linear(
    rows: int, lead: tuple[int, ...], fan_in: int, fan_out: int, bias: bool, seed: int
) -> None:
    torch.manual_seed(seed)
    layer = torch.nn.Linear(fan_in, fan_out, bias=bias, dtype=torch.float64)
    x = torch.randn(*lead, rows, fan_in, dtype=torch.float64)
    expected = torch.nn.functional.linear(x, layer.weight, layer.bias)
    got = narrow_linear(layer, x)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)  # fp64: only summation order differs


class Scaled(torch.nn.Linear):
    """A Linear subclass whose forward is not ``linear``: must be left alone."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2.0 * super().forward(x)


def test_the_switch_covers_plain_linears_only_and_always_comes_off() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), Scaled(4, 4), torch.nn.Linear(4, 4))
    hooked = model[2]
    hooked.__dict__["forward"] = hooked.forward  # what accelerate's hooks do: an instance forward
    switch = NarrowLinears(model)
    assert switch.layers == [model[0]]
    x = torch.randn(3, 4)
    with torch.no_grad():
        plain = model(x)
        with switch.active():
            assert model[0].__dict__["forward"].func is narrow_linear
            narrowed = model(x)
        assert "forward" not in model[0].__dict__ and "forward" in hooked.__dict__
        torch.testing.assert_close(narrowed, plain)
        with pytest.raises(RuntimeError, match="boom"), switch.active():
            raise RuntimeError("boom")
        assert "forward" not in model[0].__dict__


def test_narrow_is_offered_for_cpu_fp32_and_fp64_only() -> None:
    assert supports_narrow(tiny_model("llama"))  # fp64
    # Module.to converts in place: copies, so the shared tiny model stays fp64.
    assert supports_narrow(copy.deepcopy(tiny_model("llama")).to(torch.float32))
    assert not supports_narrow(copy.deepcopy(tiny_model("llama")).to(torch.bfloat16))
    verifier = make_verifier(tiny_model("llama"))
    assert verifier.narrow is not None and verifier.narrow_rows == 0  # offered, off until calibration says


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_generations_with_narrow_verification_match_plain_greedy(arch: str) -> None:
    model = tiny_model(arch)
    rng = random.Random(f"narrow-{arch}")
    narrowed_steps = 0
    for seed in range(3):
        prompt = random_prompt(rng)
        truth = hf_greedy(model, prompt, 40)
        drafter = OracleTreeDrafter(truth, VOCAB, seed=seed, size=12, depth=5)
        generator = specdec.Generator(model, drafter=drafter, budget="full")
        generator.verifier.narrow_rows = 64  # every multi-node tree narrow
        result = generator.generate(prompt, max_new_tokens=40)
        assert result.tokens == truth
        assert not any("forward" in m.__dict__ for m in model.modules())  # the model is left as it was
        narrowed_steps += sum(r.tree_size > 1 for r in result.stats.records)
        IDENTITY_COUNTS[f"{arch}/narrow"] += 1
    assert narrowed_steps > 10  # the narrow path really ran


def test_threshold_is_the_last_size_of_an_unbroken_run_of_wins() -> None:
    sizes = (1, 2, 4, 8, 16)
    inf = np.inf
    plain = np.array([[1.0, 2.0, 2.0, 3.0, 4.0], [1.5, 2.5, 2.5, 3.5, 4.5]])
    assert _narrow_threshold(sizes, plain, np.array([[inf, 1.5, 1.6, 3.5, 3.0], [inf, 2.0, 2.0, 3.6, 3.0]])) == 4
    # A win after a loss does not count: sizes between would be guesses.
    assert _narrow_threshold(sizes, plain, np.array([[inf, 2.5, 1.0, 1.0, 1.0]] * 2)) == 0
    # The verdict sums the contexts: a loss at one context is outweighed by a larger win at the other.
    assert _narrow_threshold(sizes, plain, np.array([[inf, 2.1, 3, 4, 5], [inf, 1.0, 3, 4, 5]])) == 2
    assert _narrow_threshold(sizes, plain, np.full((2, 5), inf)) == 0


def test_calibration_times_narrow_products_and_the_cost_model_applies_its_choice(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    forget_cost_models()
    verifier = make_verifier(tiny_model("llama"))
    seen: list[tuple[int, int]] = []
    verify = verifier.verify

    def spy(state: object, tree: specdec.DraftTree, topk: int = 0) -> object:
        seen.append((tree.size, verifier.narrow_rows))
        return verify(state, tree, topk)  # type: ignore[arg-type]

    monkeypatch.setattr(verifier, "verify", spy)
    table = calibrate(verifier, sizes=(1, 2, 4, 64), contexts=(8, 32), repeats=1)
    assert verifier.narrow_rows == 0  # calibration leaves the verifier as it found it
    narrow_timed = {size for size, rows in seen if rows}
    assert narrow_timed == {2, 4}  # 64 is past NARROW_MAX_SIZE, 1 is never narrow
    assert all(rows in (0, size) for size, rows in seen)
    assert table.narrow_rows in (0, 2, 4)
    # The cost model hands the table's choice to the verifier it serves.
    forced = CostTable(table.sizes, table.contexts, table.seconds, table.identity, narrow_rows=4)
    monkeypatch.setattr("specdec.budget.cost.calibrate", lambda v: forced)
    model, _ = cost_model(verifier)
    assert model.table.narrow_rows == 4 and verifier.narrow_rows == 4
    other = make_verifier(verifier.model)
    cost_model(other)  # from memory this time
    assert other.narrow_rows == 4
    forget_cost_models()


def test_cost_table_carries_narrow_rows() -> None:
    table = CostTable((1, 4), (8, 16), ((1.0, 2.0), (1.5, 2.5)), {"device": "x"}, narrow_rows=4)
    assert CostTable.from_json(table.to_json()) == table
    with pytest.raises(specdec.SpecDecError, match="narrow_rows must be a non-negative int, got -1"):
        CostTable((1,), (8,), ((1.0,),), {}, narrow_rows=-1)
