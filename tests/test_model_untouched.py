"""The user's model is never left changed by specdec, whatever happens during a run (issue 29).

Runs on each CPU engine (``specdec``: specdec's own forward; ``hf``: the model's forward;
``buckets``: the static cache) from several threads at once, and runs interrupted by an
exception or a ``KeyboardInterrupt`` in the middle of a step (inside a forward, and in the
drafter after a verification). After each, the model must be as it was: its configuration
(the attention implementation included) and generation config, every module's instance
attributes (no instance ``forward``, no hooks left), training flags, every parameter and
buffer bitwise and unmoved, and ``model(...)``'s output bitwise. The generator that was
interrupted must still give plain decoding's output afterwards.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import in_threads
from test_lossless import hf_greedy
from tiny_models import VOCAB, tiny_model

import specdec
from specdec.drafters import PromptLookupDrafter
from specdec.types import DraftTree, Feedback

ENGINES = ("specdec", "hf", "buckets")
PROMPTS = [[(7 * i + j) % VOCAB for j in range(10)] * 2 + [i + 1, i + 2] for i in range(6)]  # repeats: drafts
NEW_TOKENS = 24
PROBE = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3]])


def snapshot(model: Any) -> dict[str, Any]:
    """Everything of ``model`` a run could change (module docstring)."""
    with torch.inference_mode():
        output = model(input_ids=PROBE).logits.clone()
    return {
        "config": model.config.to_dict(),
        "attention": model.config._attn_implementation,
        "generation_config": model.generation_config.to_dict(),
        "modules": {name: (type(m), sorted(vars(m)), m.training, len(m._forward_hooks), len(m._forward_pre_hooks))
                    for name, m in model.named_modules()},
        "tensors": {name: (t.detach().clone(), t.data_ptr(), t.dtype, t.device, t.requires_grad, t._version)
                    for name, t in [*model.named_parameters(), *model.named_buffers()]},
        "output": output,
    }


def assert_unchanged(model: Any, before: dict[str, Any]) -> None:
    after = snapshot(model)
    assert after["attention"] == before["attention"]
    assert after["config"] == before["config"]
    assert after["generation_config"] == before["generation_config"]
    assert after["modules"] == before["modules"]
    assert not [name for name, m in model.named_modules() if "forward" in vars(m)]
    assert after["tensors"].keys() == before["tensors"].keys()
    for name, (tensor, *rest) in before["tensors"].items():
        now, *now_rest = after["tensors"][name]
        assert now_rest == rest, f"{name}: storage, dtype, device, requires_grad or version changed"
        assert torch.equal(now, tensor), f"{name} changed"
    assert torch.equal(after["output"], before["output"]), "model(...) gives another output"


@pytest.fixture
def model() -> Any:
    """A tiny Llama (the architecture every cache runs), its state checked after the test too."""
    model = tiny_model("llama")
    before = snapshot(model)
    yield model
    assert_unchanged(model, before)


def expected(model: Any) -> list[list[int]]:
    return [hf_greedy(model, prompt, NEW_TOKENS) for prompt in PROMPTS]


@pytest.mark.parametrize("engine", ENGINES)
def test_threads_on_one_generator_and_on_one_model(model: Any, engine: str) -> None:
    before = snapshot(model)
    truth = expected(model)
    shared = specdec.Generator(model, drafter="sam+recycling", engine=engine, budget="full")
    outputs = in_threads(lambda i: shared.generate(PROMPTS[i], max_new_tokens=NEW_TOKENS).tokens, len(PROMPTS))
    assert outputs == truth  # one Generator from six threads: each call whole, in turn
    assert_unchanged(model, before)
    own = in_threads(lambda i: specdec.Generator(model, drafter="pld", engine=engine, budget="full").generate(
        PROMPTS[i], max_new_tokens=NEW_TOKENS).tokens, len(PROMPTS))
    assert own == truth  # a Generator per thread, one model: in parallel
    assert_unchanged(model, before)


class Interrupting:
    """PLD's drafts; raises ``error`` in ``update`` after the ``at``-th verification (mid-step)."""

    name = "interrupting"
    feedback_topk = 0

    def __init__(self, error: BaseException, at: int) -> None:
        self.inner = PromptLookupDrafter()
        self.error, self.at, self.steps = error, at, 0

    def reset(self, prompt: list[int], feedback: Feedback | None = None) -> None:
        self.inner.reset(prompt, feedback)

    def propose(self, pending: int, max_nodes: int) -> DraftTree:
        return self.inner.propose(pending, max_nodes)

    def update(self, accepted: list[int], feedback: Feedback | None) -> None:
        self.steps += 1
        if self.steps == self.at:
            raise self.error
        self.inner.update(accepted, feedback)


def raise_in_forward(model: Any, error: BaseException, after: int) -> Any:
    """A hook on the model's final norm that raises ``error`` at its ``after``-th call (inside a forward)."""
    calls = [0]

    def hook(module: Any, args: Any, output: Any) -> None:
        calls[0] += 1
        if calls[0] == after:
            raise error

    return model.model.norm.register_forward_hook(hook)


@pytest.mark.parametrize("error", [KeyboardInterrupt(), RuntimeError("a failure mid-step")], ids=["interrupt", "error"])
@pytest.mark.parametrize("engine", ENGINES)
def test_a_run_interrupted_mid_step_leaves_the_model_and_the_generator_sound(
    model: Any, engine: str, error: BaseException
) -> None:
    before = snapshot(model)
    truth = expected(model)
    generator = specdec.Generator(model, drafter="pld", engine=engine, budget="full")
    assert generator.generate(PROMPTS[0], max_new_tokens=NEW_TOKENS).tokens == truth[0]
    interrupted = specdec.Generator(model, drafter=Interrupting(error, at=3), engine=engine, budget="full")
    with pytest.raises(type(error)):
        interrupted.generate(PROMPTS[0], max_new_tokens=NEW_TOKENS)
    assert_unchanged(model, before)
    handle = raise_in_forward(model, error, after=4)  # the prefill, then three steps' forwards
    try:
        with pytest.raises(type(error)):
            generator.generate(PROMPTS[1], max_new_tokens=NEW_TOKENS)
    finally:
        handle.remove()
    assert_unchanged(model, before)
    # The interrupted generator serves the next prompts as if nothing had happened.
    assert [generator.generate(p, max_new_tokens=NEW_TOKENS).tokens for p in PROMPTS[:3]] == truth[:3]
    assert_unchanged(model, before)


def test_generate_from_its_own_callback_is_refused_and_the_generator_goes_on(model: Any) -> None:
    """The lock is not re-entrant: a generate() from inside on_tokens would wait for itself; it raises instead."""
    from specdec.errors import SpecDecError

    generator = specdec.Generator(model, drafter="pld", budget="full")

    def nested(tokens: list[int]) -> None:
        generator.generate(PROMPTS[1], max_new_tokens=4)

    with pytest.raises(SpecDecError, match="called while this thread is inside one of the generator's own calls"):
        generator.generate(PROMPTS[0], max_new_tokens=NEW_TOKENS, on_tokens=nested)
    assert generator.generate(PROMPTS[0], max_new_tokens=NEW_TOKENS).tokens == hf_greedy(model, PROMPTS[0], NEW_TOKENS)
