"""``min_new_tokens`` and ``stop_when``: the same tokens on the plain and the speculative path.

``min_new_tokens`` keeps the EOS ids from being chosen before that many new tokens, as
``generate``'s ``min_new_tokens`` does; it must equal ``model.generate`` exactly on the tiny
fp64 models, greedy, and equal specdec's plain sampling when sampling. ``stop_when`` ends a
generation after the first token for which it holds.
"""

from __future__ import annotations

import pytest
import torch
from oracle_drafter import OracleTreeDrafter
from tiny_models import ARCHITECTURES, VOCAB, tiny_model

import specdec
from specdec.sampling import EosSuppressed, Greedy

PROMPT = [4, 4, 9, 2, 4, 4, 9, 2, 4, 4]


def hf_tokens(model: torch.nn.Module, prompt: list[int], **kwargs: object) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, **kwargs)
    return [int(t) for t in out[0, len(prompt) :]]


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_min_new_tokens_equals_generate(arch: str) -> None:
    model = tiny_model(arch)
    plain = hf_tokens(model, PROMPT, max_new_tokens=40)
    eos = plain[1]  # without a minimum, generation would end after two tokens
    for minimum in (0, 1, 5, 17):
        expected = hf_tokens(model, PROMPT, max_new_tokens=40, eos_token_id=eos, min_new_tokens=minimum or None)
        assert eos not in expected[:minimum]
        for drafter in ("none", "pld"):
            result = specdec.run(model, PROMPT, drafter, max_new_tokens=40, eos_token_id=eos, min_new_tokens=minimum)
            assert result.tokens == expected, (drafter, minimum)
        truth = hf_tokens(model, PROMPT, max_new_tokens=40, eos_token_id=eos, min_new_tokens=minimum or None)
        oracle = OracleTreeDrafter(truth, VOCAB, seed=minimum, size=20, depth=7)
        result = specdec.run(model, PROMPT, oracle, max_new_tokens=40, eos_token_id=eos, min_new_tokens=minimum,
                             budget="full")  # fmt: skip
        assert result.tokens == expected


def test_min_new_tokens_sampling_equals_plain_sampling() -> None:
    model = tiny_model("llama")
    options = dict(max_new_tokens=40, do_sample=True, temperature=1.5, seed=3, min_new_tokens=20)
    plain = specdec.run(model, PROMPT, "none", **options)
    eos = plain.tokens[25]
    plain = specdec.run(model, PROMPT, "none", eos_token_id=eos, **options)
    assert eos not in plain.tokens[:20]
    for drafter in ("pld", "sam+recycling"):
        assert specdec.run(model, PROMPT, drafter, eos_token_id=eos, **options).tokens == plain.tokens


def test_eos_suppressed_chooser() -> None:
    logits = torch.tensor([[0.0, 5.0, 1.0], [0.0, 5.0, 1.0], [0.0, 5.0, 1.0]])
    chooser = EosSuppressed(Greedy(), [1], until=11)
    assert chooser.choose(logits, torch.tensor([9, 10, 11])).tolist() == [2, 2, 1]
    assert chooser.choose(logits[:1], torch.tensor([12])).tolist() == [1]  # past the minimum: EOS again


def test_stop_when_ends_after_the_first_token_it_holds_for() -> None:
    model = tiny_model("qwen3")
    plain = specdec.run(model, PROMPT, "none", max_new_tokens=40).tokens
    target = plain[12]
    seen: list[int] = []

    def stop_when(new: list[int]) -> bool:
        seen.append(len(new))
        return new[-1] == target

    for drafter in ("none", "pld"):
        seen.clear()
        result = specdec.run(model, PROMPT, drafter, max_new_tokens=40, stop_when=stop_when)
        first = plain.index(target)
        assert result.tokens == plain[: first + 1]
        assert result.stats.stop_reason == "stop_when"
        assert seen == list(range(1, first + 2))  # asked once per new token, in order


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"min_new_tokens": -1}, "min_new_tokens must be an int >= 0"),
        ({"min_new_tokens": "3"}, "min_new_tokens must be an int >= 0"),
        ({"stop_when": 5}, "stop_when must be a function"),
    ],
)
def test_bad_values_are_refused(options: dict[str, object], message: str) -> None:
    with pytest.raises(specdec.SpecDecError, match=message):
        specdec.run(tiny_model("llama"), PROMPT, "none", max_new_tokens=5, **options)  # type: ignore[arg-type]
