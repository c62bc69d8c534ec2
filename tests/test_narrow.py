"""Narrow products (``specdec.backends.narrow``): the same math as ``linear``, scoped to one forward.

Checked: the product itself against ``torch.nn.functional.linear`` (random shapes, one row padded, with
and without bias, 2D and 3D inputs); the switch installs on plain ``Linear`` layers only
and always comes off, an exception included; whole generations with every multi-node
verification narrow are token-identical to plain greedy decoding on the tiny fp64 models,
and with one-node steps with the padded product are too; and calibration's kernel choice
(the rules, the table and its file, the verifier the Generator switches, never cost_model itself).
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
from specdec.budget.calibration import calibrate, choose_kernels
from specdec.budget.calibration_cache import cost_model, forget_cost_models
from specdec.budget.cost_model import CostTable, legacy_kernels
from specdec.types import KernelChoice

NARROW_EVERYWHERE = KernelChoice.uniform("narrow")  # every multi-node tree narrow, every one-node step padded


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_one_row_is_the_first_column_of_the_row_twice(dtype: torch.dtype) -> None:
    """The padded product: bitwise the first row of the two-row narrow product of the row twice."""
    torch.manual_seed(3)
    layer = torch.nn.Linear(96, 200, dtype=dtype)
    x = torch.randn(1, 1, 96, dtype=dtype)
    twice = narrow_linear(layer, x.expand(1, 2, 96).contiguous())
    got = narrow_linear(layer, x)
    assert got.shape == (1, 1, 200) and got.is_contiguous()
    assert torch.equal(got[0, 0], twice[0, 0])
    torch.testing.assert_close(got, torch.nn.functional.linear(x, layer.weight, layer.bias))


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
    assert verifier.narrow is not None and verifier.kernels == KernelChoice()  # offered, off until told
    assert verifier.kernel_variants(1) == verifier.kernel_variants(32) == ("default", "narrow")
    assert verifier.kernel_variants(33) == ("default",)  # past NARROW_MAX_ROWS: not worth timing
    half = make_verifier(copy.deepcopy(tiny_model("llama")).to(torch.bfloat16))
    assert half.kernel_variants(1) == ("default",)
    with pytest.raises(specdec.SpecDecError, match="unknown kernel variant 'skinny'"):
        verifier.use_kernels(KernelChoice.uniform("skinny"))


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
        generator.verifier.use_kernels(NARROW_EVERYWHERE)
        result = generator.generate(prompt, max_new_tokens=40)
        assert result.tokens == truth
        assert not any("forward" in m.__dict__ for m in model.modules())  # the model is left as it was
        narrowed_steps += sum(r.tree_size > 1 for r in result.stats.records)
        IDENTITY_COUNTS[f"{arch}/narrow"] += 1
    assert narrowed_steps > 10  # the narrow path really ran


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_plain_steps_with_the_padded_product_match_plain_greedy(arch: str) -> None:
    """PLD on random prompts rarely matches: most steps are one node, all padded here."""
    model = tiny_model(arch)
    rng = random.Random(f"padded-{arch}")
    single_steps = 0
    for _ in range(3):
        prompt = random_prompt(rng)
        truth = hf_greedy(model, prompt, 40)
        generator = specdec.Generator(model, drafter="pld", budget="full")
        generator.verifier.use_kernels(NARROW_EVERYWHERE)
        result = generator.generate(prompt, max_new_tokens=40)
        assert result.tokens == truth
        single_steps += sum(r.tree_size == 1 for r in result.stats.records)
        IDENTITY_COUNTS[f"{arch}/narrow single"] += 1
    assert single_steps > 10

def test_multi_node_choice_is_an_unbroken_run_of_wins() -> None:
    sizes = (1, 2, 4, 8, 16)
    inf = np.inf
    plain = np.array([[1.0, 2.0, 2.0, 3.0, 4.0], [1.5, 2.5, 2.5, 3.5, 4.5]])

    def choice(narrow: list[list[float]]) -> KernelChoice:
        return choose_kernels(sizes, {"default": plain, "narrow": np.array(narrow)})

    assert choice([[inf, 1.5, 1.6, 3.5, 3.0], [inf, 2.0, 2.0, 3.6, 3.0]]) == legacy_kernels(4, False)
    # A win after a loss does not count: sizes between would be guesses.
    assert choice([[inf, 2.5, 1.0, 1.0, 1.0]] * 2) == KernelChoice(((1, "default"),))
    # The verdict sums the contexts: a loss at one context is outweighed by a larger win at the other.
    assert choice([[inf, 2.1, 3, 4, 5], [inf, 1.0, 3, 4, 5]]) == legacy_kernels(2, False)
    assert choice([[inf] * 5] * 2) == KernelChoice(((1, "default"),))
    # A third variant takes the sizes where it is fastest, in order, until the default wins.
    skinny = np.array([[inf, 9, 1.0, 1.0, 9], [inf, 9, 1.0, 1.0, 9]])
    mixed = choose_kernels(sizes, {"default": plain, "narrow": np.array([[inf, 1.5, 1.6, 9, 9]] * 2),
                                   "skinny": skinny})
    assert mixed == KernelChoice(((1, "default"), (2, "narrow"), (8, "skinny")))
    assert [mixed.variant_for(n) for n in (1, 2, 3, 5, 8, 9)] == ["default", "narrow", "skinny", "skinny",
                                                                   "skinny", "default"]


def test_calibration_times_every_variant_and_the_generator_applies_its_choice(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    forget_cost_models()
    model = tiny_model("llama")
    verifier = make_verifier(model)
    seen: list[tuple[int, KernelChoice]] = []
    verify = verifier.verify

    def spy(state: object, tree: specdec.DraftTree, topk: int = 0) -> object:
        seen.append((tree.size, verifier.kernels))
        return verify(state, tree, topk)  # type: ignore[arg-type]

    monkeypatch.setattr(verifier, "verify", spy)
    table = calibrate(verifier, sizes=(1, 2, 4, 64), contexts=(8, 32), repeats=1)
    assert verifier.kernels == KernelChoice()  # calibration leaves the verifier as it found it
    assert {size for size, kernels in seen if kernels == NARROW_EVERYWHERE} == {1, 2, 4}  # 64: past NARROW_MAX_ROWS
    assert all(kernels in (KernelChoice.uniform("default"), NARROW_EVERYWHERE) for _, kernels in seen)
    assert sum(kernels == NARROW_EVERYWHERE for size, kernels in seen if size == 1) == sum(
        kernels != NARROW_EVERYWHERE for size, kernels in seen if size == 1
    )  # both kernels timed as often at one node
    assert table.kernels.variant_for(64) == "default" and table.kernels.variant_for(3) in ("default", "narrow")
    # cost_model() hands the table's choice to nobody; the Generator switches its verifier to it.
    forced = CostTable(table.sizes, table.contexts, table.seconds, table.identity, legacy_kernels(4, True))
    monkeypatch.setattr("specdec.budget.calibration_cache.calibrate", lambda v: forced)
    cost, _ = cost_model(verifier)
    assert cost.table.kernels == forced.kernels and verifier.kernels == KernelChoice()
    generator = specdec.Generator(model, drafter="pld")
    generator.cost_model()  # from memory this time
    assert generator.verifier.kernels == forced.kernels
    assert [generator.verifier.kernels.variant_for(n) for n in (1, 4, 5)] == ["narrow", "narrow", "default"]
    forget_cost_models()


def test_single_node_verdict_sums_the_contexts() -> None:
    sizes = (1, 2, 4)
    plain = np.array([[1.0, 2.0, 2.0], [1.5, 2.5, 2.5]])

    def single(narrow: list[list[float]], sizes: tuple[int, ...] = sizes, plain: np.ndarray = plain) -> str:
        return choose_kernels(sizes, {"default": plain, "narrow": np.array(narrow)}).variant_for(1)

    assert single([[0.9, 9, 9], [1.4, 9, 9]]) == "narrow"
    assert single([[1.1, 1, 1], [1.5, 1, 1]]) == "default"  # a tie is no win
    assert single([[1.2, 9, 9], [1.0, 9, 9]]) == "narrow"  # 2.2 < 2.5 overall
    assert single([[0.0, 0.0]] * 2, (2, 4), plain[:, 1:]) == "default"  # one node not calibrated


def test_cost_table_carries_its_kernel_choice_and_older_files_still_read() -> None:
    table = CostTable((1, 4), (8, 16), ((1.0, 2.0), (1.5, 2.5)), {"device": "x"}, legacy_kernels(4, True))
    saved = table.to_json()
    assert CostTable.from_json(saved) == table
    assert (saved["narrow_rows"], saved["narrow_single"]) == (4, True)  # what specdec before KernelChoice read
    older = {k: v for k, v in saved.items() if k != "kernels"}  # a file written before the kernel choice value
    assert CostTable.from_json(older) == table
    with pytest.raises(specdec.SpecDecError, match="narrow_single must be a bool, got 1"):
        CostTable.from_json({**older, "narrow_single": 1})
    with pytest.raises(specdec.SpecDecError, match="narrow_rows must be a non-negative int, got -1"):
        CostTable.from_json({**older, "narrow_rows": -1})
    with pytest.raises(specdec.SpecDecError, match="calibration kernels must be"):
        CostTable.from_json({**saved, "kernels": {"ranges": [[4]]}})
    with pytest.raises(specdec.SpecDecError, match="increasing positive row counts"):
        KernelChoice(((4, "narrow"), (2, "default")))
