"""Bad input gets a clear error that names the bad value, before any work is done."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
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


def test_unknown_engine_and_tree_ops() -> None:
    with pytest.raises(SpecDecError, match="unknown engine 'cuda'"):
        specdec.run(tiny_model("llama"), [1, 2], "pld", engine="cuda")
    with pytest.raises(SpecDecError, match="unknown tree ops 'cuda'"):
        specdec.Generator(tiny_model("llama"), drafter="pld", tree_ops="cuda")


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


# -- issue 29: the rest of the arguments, each refused naming the value (or accepted) -------------


@pytest.mark.parametrize("value", [5.0, "5", True, None])
def test_max_new_tokens_not_an_int(value: object) -> None:
    with pytest.raises(SpecDecError, match=f"max_new_tokens must be an int, got {value!r}"):
        specdec.run(tiny_model("llama"), [1, 2], "pld", max_new_tokens=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [0, -1, 2.5, "8"])
def test_max_nodes_not_a_positive_int(value: object) -> None:
    with pytest.raises(SpecDecError, match=f"max_nodes must be a positive int .*got {value!r}"):
        specdec.run(tiny_model("llama"), [1, 2], "pld", max_nodes=value)  # type: ignore[arg-type]


def test_tensor_prompts() -> None:
    """[L] and [1, L] tensors (torch or NumPy) are one sequence; [2, L] is refused naming its shape."""
    model = tiny_model("llama")
    expected = specdec.run(model, [1, 2, 3], "none", max_new_tokens=6).tokens
    for prompt in (torch.tensor([1, 2, 3]), torch.tensor([[1, 2, 3]]), np.array([1, 2, 3])):
        assert specdec.run(model, prompt, "pld", max_new_tokens=6).tokens == expected
    with pytest.raises(SpecDecError, match=r"\[L\] or \[1, L\] \(one sequence\), got shape \(2, 3\)"):
        specdec.run(model, torch.tensor([[1, 2, 3], [4, 5, 6]]), "pld", max_new_tokens=6)


def test_numpy_integers_in_a_prompt_list_are_token_ids() -> None:
    model = tiny_model("llama")
    expected = specdec.run(model, [1, 2, 3], "none", max_new_tokens=6).tokens
    mixed = [np.int64(1), np.int32(2), 3]
    assert specdec.run(model, mixed, "pld", max_new_tokens=6).tokens == expected  # type: ignore[arg-type]
    with pytest.raises(SpecDecError, match=r"got np.float64\(1.0\) \(float64\) at index 1"):
        specdec.run(model, [1, np.float64(1.0)], "pld")  # type: ignore[list-item]
    with pytest.raises(SpecDecError, match=r"got True \(bool\) at index 0"):
        specdec.run(model, [True, 2], "pld")


def test_negative_token_id() -> None:
    with pytest.raises(SpecDecError, match=r"token id -2 is outside the model's vocabulary \[0, "):
        specdec.run(tiny_model("llama"), [1, -2, 3], "pld")


def test_model_none_and_placement_of_a_model_object() -> None:
    with pytest.raises(SpecDecError, match="model is None"):
        specdec.run(None, [1, 2], "pld")  # type: ignore[arg-type]
    for placement in ({"device": "cpu"}, {"dtype": torch.float16}):
        with pytest.raises(SpecDecError, match="device= and dtype= place a model that specdec loads"):
            specdec.Generator(tiny_model("llama"), drafter="pld", **placement)  # type: ignore[arg-type]


def test_chat_messages_without_a_tokenizer() -> None:
    with pytest.raises(SpecDecError, match="chat messages need a tokenizer"):
        specdec.run(tiny_model("llama"), [{"role": "user", "content": "hi"}], "pld")


@pytest.mark.parametrize("value", ["2", 2.0, -1, [2, "3"], [True]])
def test_eos_token_id_not_a_token_id(value: object) -> None:
    """A string or float never equals a token: refused, not silently never matched."""
    with pytest.raises(SpecDecError, match="eos_token_id must be a token id or a list of token ids"):
        specdec.run(tiny_model("llama"), [1, 2], "pld", eos_token_id=value)  # type: ignore[arg-type]


def test_eos_token_id_and_ignore_eos_take_effect() -> None:
    model = tiny_model("llama")
    plain = specdec.run(model, [1, 2, 3], "none", max_new_tokens=12).tokens
    eos = plain[4]
    cut = specdec.run(model, [1, 2, 3], "pld", max_new_tokens=12, eos_token_id=np.int64(eos))
    assert cut.tokens == plain[: plain.index(eos) + 1] and cut.stats.stop_reason == "eos"
    ignored = specdec.run(model, [1, 2, 3], "pld", max_new_tokens=12, eos_token_id=eos, ignore_eos=True)
    assert ignored.tokens == plain
    with pytest.raises(SpecDecError, match="ignore_eos must be True or False, got 'no'"):
        specdec.run(model, [1, 2], "pld", ignore_eos="no")  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_logits_that_are_not_finite_stop_sampling_with_a_clear_error(value: float) -> None:
    """A broken model (NaN or inf logits) on the sampling path: an error naming it, not a token made up.

    (Greedy decoding takes the argmax as ``generate`` does, NaN included: identity holds there.)
    """
    model = copy.deepcopy(tiny_model("llama"))
    with torch.no_grad():
        model.lm_head.weight[7] = value  # token 7's logit is NaN or +-inf everywhere
    with pytest.raises(SpecDecError, match=r"sampling needs finite logits, got NaN or inf .* positions \[3\]"):
        specdec.run(model, [1, 2, 3], "pld", max_new_tokens=6, do_sample=True, temperature=0.8, seed=1)
