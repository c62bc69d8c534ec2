"""The drafters that run a model (``early-exit``, ``model``): lossless, in step with the target, clear errors.

On tiny random fp64 models (tests/tiny_models.py) the speculative output must equal plain
decoding token for token: ``model.generate`` greedy, and specdec's ``none`` drafter under the
same seed when sampling. A target drafting for itself (``draft_model`` = the target, or every
layer under ``early-exit``) must have its drafts accepted: that is what shows the draft cache
is in step with the committed tokens, since any token fed at a wrong position would change them.
"""

from __future__ import annotations

import copy
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_lossless import hf_greedy, random_prompt
from tiny_models import VOCAB, tiny_model

import specdec
from specdec.drafters import make_factory
from specdec.drafters.base import DrafterContext
from specdec.drafters.model_draft import ModelDrafter, early_exit_view
from specdec.errors import SpecDecError

ARCHS = ("llama", "qwen2", "gemma")
RUNNER_ARCHS = ("llama", "qwen2")  # the ones engine="specdec" runs (its decoder runner)
CASES = [(arch, engine) for arch in ARCHS for engine in ("hf", "specdec") if engine == "hf" or arch in RUNNER_ARCHS]
_SMALL: dict[str, Any] = {}


def small_draft(arch: str) -> Any:
    """A one-layer fp64 model of ``arch`` with the target's vocabulary and other random weights."""
    if arch not in _SMALL:
        from transformers import AutoModelForCausalLM

        config = copy.deepcopy(tiny_model(arch).config)
        config.num_hidden_layers = 1
        if isinstance(getattr(config, "layer_types", None), list):
            config.layer_types = config.layer_types[:1]
        torch.manual_seed(7)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float64)
        with torch.no_grad():
            for parameter in model.parameters():
                if parameter.dim() >= 2:
                    parameter.normal_(0.0, 0.3)
        _SMALL[arch] = model.eval()
    return _SMALL[arch]


def drafters(arch: str) -> list[tuple[str, dict[str, Any]]]:
    """(name, options) of every model-running drafter case on ``arch``'s target."""
    target = tiny_model(arch)
    return [
        ("early-exit", {"layers": 1}),
        ("model", {"draft_model": small_draft(arch)}),
        ("model", {"draft_model": tiny_model(arch, seed=1), "length": 3}),
        ("sam+model", {"model": {"draft_model": target}}),
        ("sam+early-exit", {"early-exit.layers": 1}),
    ]


@pytest.mark.slow  # ~20-40 s per case on a busy 2-core CPU
@pytest.mark.parametrize(("arch", "engine"), CASES)
def test_model_drafters_match_plain_greedy(arch: str, engine: str) -> None:
    target = tiny_model(arch)
    rng = random.Random(f"model-drafters-{arch}")
    for drafter, options in drafters(arch):
        prompt = random_prompt(rng)
        max_new = rng.randrange(10, 40)
        expected = hf_greedy(target, prompt, max_new)
        result = specdec.run(target, prompt, drafter, drafter_options=options, max_new_tokens=max_new,
                             budget="full", engine=engine)  # fmt: skip
        assert result.tokens == expected, f"{arch}/{engine}/{drafter} {options}: prompt {prompt}"


@pytest.mark.parametrize(("arch", "engine"), CASES)
@pytest.mark.parametrize("drafter", ["model", "early-exit"])
def test_the_target_drafting_for_itself_is_accepted(arch: str, engine: str, drafter: str) -> None:
    """draft_model = the target, or early exit after every layer: the drafts are the target's own choices."""
    target = tiny_model(arch)
    options: dict[str, Any] = {"draft_model": target} if drafter == "model" else {"layers": 2}
    prompt = [5, 17, 3, 9, 40, 2, 11]
    result = specdec.run(target, prompt, drafter, drafter_options=options, max_new_tokens=30, budget="full",
                         engine=engine)  # fmt: skip
    assert result.tokens == hf_greedy(target, prompt, 30)
    assert result.stats.mat > 1.0, result.stats.summary()
    drafted = sum(r.tree_size - 1 for r in result.stats.records)
    accepted = sum(r.accepted for r in result.stats.records)
    assert accepted >= 0.9 * drafted, f"{accepted} of {drafted} draft tokens accepted"


@pytest.mark.parametrize("arch", ["llama", "gemma"])
def test_sampling_equals_plain_sampling(arch: str) -> None:
    target = tiny_model(arch)
    prompt = [4, 8, 15, 16, 23, 42]
    for seed in (3, 4):
        options = dict(max_new_tokens=25, temperature=0.8, top_k=20, seed=seed)
        plain = specdec.run(target, prompt, "none", **options).tokens
        for drafter, drafter_options in [("model", {"draft_model": target}), ("early-exit", {"layers": 1})]:
            result = specdec.run(target, prompt, drafter, drafter_options=drafter_options, budget="full", **options)
            assert result.tokens == plain, f"{arch}/{drafter} seed {seed}"


def test_a_batch_with_a_draft_model_equals_each_row_alone() -> None:
    target = tiny_model("llama")
    rng = random.Random("model-batch")
    prompts = [random_prompt(rng) for _ in range(3)]
    results = specdec.run_batch(target, prompts, "model", drafter_options={"draft_model": small_draft("llama")},
                                batch_size=3, max_new_tokens=20, budget="full")  # fmt: skip
    assert [r.tokens for r in results] == [hf_greedy(target, p, 20) for p in prompts]


def scratch_chain(model: Any, sequence: list[int], length: int) -> list[int]:
    """The greedy chain after ``sequence`` computed with no cache (one full forward per token)."""
    tokens = list(sequence)
    with torch.no_grad():
        for _ in range(length):
            logits = model(input_ids=torch.tensor([tokens])).logits
            tokens.append(int(logits[0, -1].argmax()))
    return tokens[len(sequence):]


@settings(max_examples=12, deadline=None)
@given(
    prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12),
    steps=st.lists(st.tuples(st.booleans(), st.integers(0, 4), st.integers(0, VOCAB - 1)), min_size=1, max_size=6),
)
def test_the_draft_cache_stays_in_step_after_rejections(prompt: list[int], steps: list[tuple[bool, int, int]]) -> None:
    """Whatever the target accepts (a prefix of the draft, then its own bonus token), and on steps that draft
    nothing, every later draft equals the chain a cache-free forward gives after the committed tokens."""
    model = small_draft("llama")
    drafter = ModelDrafter(model, "model", length=4)
    drafter.reset(prompt)
    committed, pending = list(prompt), prompt[-1]
    for proposes, accept, bonus in steps:
        if proposes:
            tree = drafter.propose(pending, 16)
            draft = list(tree.tokens[1:])
            assert draft == scratch_chain(model, [*committed, pending], 4)
            assert drafter.cached == [*committed, pending, *draft[:-1]]
            assert drafter.cache_length() == len(drafter.cached)
            taken = draft[: min(accept, len(draft))]
        else:
            taken = []  # a step that verified the pending token alone
        accepted = [pending, *taken]
        drafter.update(accepted, None)
        committed += accepted
        pending = bonus
    assert drafter.committed == committed


def test_early_exit_view_leaves_the_target_as_it_was() -> None:
    target = tiny_model("llama")
    view = early_exit_view(target, 1)
    assert len(view.model.layers) == 1 and len(target.model.layers) == 2
    assert view.config.num_hidden_layers == 1 and target.config.num_hidden_layers == 2
    assert view.model.layers[0] is target.model.layers[0] and view.lm_head is target.lm_head


# -- clear errors --------------------------------------------------------------------------------------
def test_a_draft_model_is_required() -> None:
    with pytest.raises(SpecDecError, match="needs draft_model="):
        specdec.run(tiny_model("llama"), [1, 2, 3], "model", max_new_tokens=3)


def test_a_draft_model_with_another_vocabulary_names_both_sizes() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    other = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB + 4, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    with pytest.raises(SpecDecError, match=f"{VOCAB + 4} tokens and the target's {VOCAB}"):
        specdec.run(tiny_model("llama"), [1, 2, 3], "model", drafter_options={"draft_model": other})


def test_a_draft_model_must_be_a_model() -> None:
    with pytest.raises(SpecDecError, match="must be a Hugging Face causal LM or a checkpoint directory, got int"):
        make_factory("model", {"draft_model": 3}, DrafterContext(vocab_size=VOCAB))
    with pytest.raises(SpecDecError, match="no model at 'HuggingFaceTB/SmolLM2-135M'"):
        make_factory("model", {"draft_model": "HuggingFaceTB/SmolLM2-135M"}, DrafterContext(vocab_size=VOCAB))


def test_a_draft_model_from_a_checkpoint_directory(tmp_path: Path) -> None:
    """What a command line's --option draft_model=PATH gives: loaded in the target's dtype, drafting as the object."""
    from test_tokenizer_identity import saved_tokenizer

    small_draft("llama").save_pretrained(tmp_path)
    saved_tokenizer(tmp_path, VOCAB)
    target = tiny_model("llama")
    prompt = [5, 6, 7, 5, 6]
    loaded = specdec.run(target, prompt, "model", drafter_options={"draft_model": str(tmp_path)}, max_new_tokens=15,
                         budget="full")  # fmt: skip
    given = specdec.run(target, prompt, "model", drafter_options={"draft_model": small_draft("llama")},
                        max_new_tokens=15, budget="full")  # fmt: skip
    assert loaded.tokens == given.tokens == hf_greedy(target, prompt, 15)
    assert [r.accepted for r in loaded.stats.records] == [r.accepted for r in given.stats.records]


def test_early_exit_needs_the_target_model() -> None:
    with pytest.raises(SpecDecError, match="no target model"):
        make_factory("early-exit", {}, DrafterContext(vocab_size=VOCAB))
    with pytest.raises(SpecDecError, match="no target model"):
        make_factory("sam+early-exit")


@pytest.mark.parametrize("layers", [0, 3, True, "1"])
def test_early_exit_layers_out_of_range(layers: Any) -> None:
    with pytest.raises(SpecDecError, match=r"layers must be an int in \[1, 2\]"):
        make_factory("early-exit", {"layers": layers}, DrafterContext(model=tiny_model("llama")))


def test_early_exit_names_what_the_layout_lacks() -> None:
    with pytest.raises(SpecDecError, match="GPT2LMHeadModel has no model.model"):
        make_factory("early-exit", {}, DrafterContext(model=tiny_model("gpt2")))


def test_unknown_options_are_named() -> None:
    with pytest.raises(SpecDecError, match="no option 'layer'.*valid options: layers, length"):
        make_factory("early-exit", {"layer": 1}, DrafterContext(model=tiny_model("llama")))
    with pytest.raises(SpecDecError, match="length must be a positive int"):
        make_factory("model", {"draft_model": tiny_model("llama"), "length": 0})


@pytest.mark.parametrize("drafter", ["early-exit", "model"])
def test_the_fixed_shape_engine_drafts_alongside(drafter: str) -> None:
    """engine="buckets" (a static cache, eager): the drafter's own forwards leave the verifier's cache alone."""
    target = tiny_model("llama")
    prompt = [9, 8, 7, 9, 8]
    options: dict[str, Any] = {"layers": 2} if drafter == "early-exit" else {"draft_model": target}
    result = specdec.run(target, prompt, drafter, drafter_options=options, max_new_tokens=20, budget="full",
                         engine="buckets")  # fmt: skip
    assert result.tokens == hf_greedy(target, prompt, 20)
    assert result.stats.mat > 1.0


def test_past_the_draft_models_context_it_drafts_nothing() -> None:
    """A draft model of a shorter context than the sequence: single-node trees, no forward past its positions."""
    draft = copy.deepcopy(small_draft("llama"))
    draft.config.max_position_embeddings = 12
    drafter = ModelDrafter(draft, "model", length=4)
    drafter.reset(list(range(2, 10)))  # 8 committed: the pending token sits at position 8
    assert drafter.propose(10, 16).size == 5  # positions 8..11 fed: the pending token and 3 of the 4 draft tokens
    drafter.update([10, 11, 12, 13], None)
    assert drafter.propose(14, 16).size == 1
