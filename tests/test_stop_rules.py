"""EOS, max_new_tokens, stop strings and streaming: output ends exactly where plain decoding's would."""

from __future__ import annotations

import pytest
import torch
from oracle_drafter import OracleTreeDrafter
from tiny_models import VOCAB, tiny_model

import specdec
from specdec.decoding import StopRules
from specdec.errors import SpecDecError

PROMPT = [7, 3, 9, 3, 9, 3, 1, 2]


def greedy(n: int) -> list[int]:
    model = tiny_model("llama")
    ids = torch.tensor([PROMPT])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False)
    return [int(t) for t in out[0, len(PROMPT) :]]


@pytest.mark.parametrize("drafter_kind", ["none", "pld", "oracle"])
def test_eos_cuts_after_first_eos(drafter_kind: str) -> None:
    truth = greedy(60)
    eos = truth[17]
    first = truth.index(eos)
    drafter = OracleTreeDrafter(truth, VOCAB, size=16, depth=8) if drafter_kind == "oracle" else drafter_kind
    result = specdec.run(tiny_model("llama"), PROMPT, drafter, max_new_tokens=60, eos_token_id=eos)
    assert result.tokens == truth[: first + 1]
    assert result.stats.stop_reason == "eos"


@pytest.mark.parametrize("max_new", [1, 2, 5, 33])
def test_max_new_tokens_is_exact(max_new: int) -> None:
    truth = greedy(40)
    drafter = OracleTreeDrafter(truth, VOCAB, size=16, depth=8)
    result = specdec.run(tiny_model("llama"), PROMPT, drafter, max_new_tokens=max_new)
    assert result.tokens == truth[:max_new]
    assert result.stats.stop_reason == "max_new_tokens"
    if max_new == 1:
        assert result.stats.steps == 0  # the prefill alone decides the only token


def test_stop_rules_cut_hand_cases() -> None:
    text = {1: "a", 2: "b", 3: "c", 4: "d"}
    rules = StopRules(10, frozenset({4}), ("bc",), decode=lambda ids: "".join(text[t] for t in ids))
    assert rules.cut([1, 2], 0) is None
    assert rules.cut([1, 2, 3, 1], 1) == (3, "stop_string")  # "abc" completes at the third token
    assert rules.cut([1, 1, 4, 2, 3], 1) == (3, "eos")  # EOS comes before the stop string
    assert rules.cut([1] * 12, 8) == (10, "max_new_tokens")


def test_stop_string_with_speculation_matches_plain() -> None:
    truth = greedy(60)
    decode = {i: f"<{i}>" for i in range(VOCAB)}

    class Tokenizer:
        eos_token_id = None
        chat_template = None

        def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
            return "".join(decode[t] for t in ids)

    stop = f"<{truth[20]}><{truth[21]}>"
    expected_end = next(i for i in range(len(truth)) if stop in Tokenizer().decode(truth[: i + 1])) + 1
    drafter = OracleTreeDrafter(truth, VOCAB, size=12, depth=8)
    result = specdec.run(tiny_model("llama"), PROMPT, drafter, tokenizer=Tokenizer(), max_new_tokens=60, stop=stop)
    assert result.tokens == truth[:expected_end]
    assert result.stats.stop_reason == "stop_string"
    assert result.text is not None and result.text.endswith(stop)


def test_stop_string_with_a_character_split_across_tokens() -> None:
    """A byte-level tokenizer: the stop string's "é" is two tokens (0xC3, 0xA9). Half of it decodes to
    U+FFFD, which matches nothing; the output ends at the token that completes the character, also
    when that token arrives in the middle of an accepted draft."""
    truth = greedy(60)
    at = next(i for i in range(20, 59) if truth[i] != truth[i + 1] and truth[i] not in truth[:i])
    table = {t: bytes([0x61 + t % 26]) for t in range(VOCAB)}  # ASCII letters
    table[truth[at]], table[truth[at + 1]] = b"\xc3", b"\xa9"  # "é" = C3 A9 in UTF-8

    class Bytes:
        eos_token_id = None
        chat_template = None

        def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
            return b"".join(table[t] for t in ids).decode("utf-8", errors="replace")

    stop = table[truth[at - 1]].decode() + "é"
    assert stop not in Bytes().decode(truth[: at + 1]) and Bytes().decode(truth[: at + 1]).endswith("\ufffd")
    expected_end = next(i for i in range(len(truth)) if stop in Bytes().decode(truth[: i + 1])) + 1
    assert expected_end == at + 2
    for drafter in ("none", OracleTreeDrafter(truth, VOCAB, size=12, depth=8)):
        result = specdec.run(tiny_model("llama"), PROMPT, drafter, tokenizer=Bytes(), max_new_tokens=60, stop=stop)
        assert result.tokens == truth[:expected_end] and result.stats.stop_reason == "stop_string"
        assert result.text is not None and result.text.endswith(stop)


def test_streaming_delivers_exactly_the_output() -> None:
    truth = greedy(50)
    seen: list[list[int]] = []
    result = specdec.run(
        tiny_model("llama"), PROMPT, OracleTreeDrafter(truth, VOCAB, size=12, depth=8), max_new_tokens=37,
        on_tokens=seen.append,
    )
    assert [t for batch in seen for t in batch] == result.tokens == truth[:37]
    assert len(seen) > 1 and all(batch for batch in seen)


def test_context_length_stops_generation() -> None:
    model = tiny_model("llama")  # 256 positions
    prompt = [1] * 250
    result = specdec.run(model, prompt, "pld", max_new_tokens=50)
    assert result.stats.stop_reason == "context_length"
    assert len(result.tokens) == 7  # positions 250..255 hold the verified tokens, plus the last decided one
    assert result.tokens == specdec.run(model, prompt, "none", max_new_tokens=50).tokens


def test_stop_rules_validation() -> None:
    with pytest.raises(SpecDecError, match="max_new_tokens must be at least 1"):
        StopRules(0)
    with pytest.raises(SpecDecError, match="need a tokenizer"):
        StopRules(5, stop_strings=("x",))
    with pytest.raises(SpecDecError, match="non-empty"):
        StopRules(5, stop_strings=("",), decode=str)
