"""Bad input gets a clear error that names the bad value, before any work is done."""

from __future__ import annotations

import pytest
from tiny_models import tiny_model

import specdec
from specdec.errors import SpecDecError, UnsupportedModelError
from specdec.types import DraftTree


def test_empty_prompt() -> None:
    with pytest.raises(SpecDecError, match="prompt is empty"):
        specdec.run(tiny_model("llama"), [], "pld")


def test_empty_text_prompt() -> None:
    with pytest.raises(SpecDecError, match="prompt is empty"):
        specdec.run(tiny_model("llama"), "", "pld")


def test_text_prompt_without_tokenizer() -> None:
    with pytest.raises(SpecDecError, match="needs a tokenizer"):
        specdec.run(tiny_model("llama"), "hello", "pld")


def test_prompt_past_context_length() -> None:
    with pytest.raises(SpecDecError, match="the prompt has 300 tokens, past the model's context length of 256"):
        specdec.run(tiny_model("llama"), [1] * 300, "pld")


@pytest.mark.parametrize("value", [0, -3])
def test_max_new_tokens_not_positive(value: int) -> None:
    with pytest.raises(SpecDecError, match=f"max_new_tokens must be at least 1, got {value}"):
        specdec.run(tiny_model("llama"), [1, 2], "pld", max_new_tokens=value)


def test_unknown_drafter_lists_valid_names() -> None:
    with pytest.raises(SpecDecError, match=r"unknown drafter 'pdl'; valid names: .*none.*pld"):
        specdec.run(tiny_model("llama"), [1, 2], "pdl")


def test_unknown_backend() -> None:
    with pytest.raises(SpecDecError, match="unknown backend 'cuda'"):
        specdec.run(tiny_model("llama"), [1, 2], "pld", backend="cuda")


def test_out_of_vocabulary_token() -> None:
    with pytest.raises(SpecDecError, match="token id 500 is outside the model's vocabulary"):
        specdec.run(tiny_model("llama"), [1, 500], "pld")


def test_bad_prompt_types() -> None:
    with pytest.raises(SpecDecError, match="token ids"):
        specdec.run(tiny_model("llama"), [1.5, 2], "pld")  # type: ignore[list-item]
    with pytest.raises(SpecDecError, match="unsupported prompt type"):
        specdec.run(tiny_model("llama"), 42, "pld")


@pytest.mark.parametrize("implementation", ["flash_attention_2", "flex_attention"])
def test_attention_that_ignores_tree_masks_is_refused(implementation: str) -> None:
    model = tiny_model("llama")
    original = model.config._attn_implementation
    model.config._attn_implementation = implementation  # what loading with that implementation records
    try:
        with pytest.raises(UnsupportedModelError, match="attn_implementation='sdpa'"):
            specdec.run(model, [1, 2], "pld")
    finally:
        model.config._attn_implementation = original


def test_training_mode_is_refused() -> None:
    model = tiny_model("llama")
    model.train()
    try:
        with pytest.raises(UnsupportedModelError, match="training mode"):
            specdec.run(model, [1, 2], "none")
    finally:
        model.eval()


def test_drafter_with_wrong_root_is_caught() -> None:
    class Liar:
        name = "liar"
        feedback_topk = 0

        def reset(self, prompt: list[int], feedback: object = None) -> None: ...

        def propose(self, pending: int, max_nodes: int) -> DraftTree:
            return DraftTree.single(pending + 1)

        def update(self, accepted: list[int], feedback: object) -> None: ...

    with pytest.raises(SpecDecError, match="rooted its tree at token"):
        specdec.run(tiny_model("llama"), [1, 2], Liar(), max_new_tokens=5)


def test_options_with_a_drafter_object_are_refused() -> None:
    from specdec.drafters import PromptLookupDrafter

    with pytest.raises(SpecDecError, match="only when the drafter is given by name"):
        specdec.run(tiny_model("llama"), [1, 2], PromptLookupDrafter(), drafter_options={"num_draft": 3})


def test_bad_model_path() -> None:
    with pytest.raises(SpecDecError, match="no model at"):
        specdec.run("/nonexistent/model", [1, 2], "pld")


def test_bad_attention_in_load_model() -> None:
    with pytest.raises(SpecDecError, match="attn_implementation='flash_attention_2' is not supported"):
        specdec.load_model("/nonexistent", attn_implementation="flash_attention_2")
