"""``model.generate(..., custom_generate=specdec.hf_generate(...))``: what generate returns, token for token.

On the tiny fp64 models every greedy output must equal ``model.generate``'s own exactly
(no near-tie tolerance: see tiny_models.py); sampling must equal specdec's own plain
sampling with the same seed. Streamers must receive what plain ``generate`` gives them, and
every option specdec does not implement must be refused with an error that names it.
"""

from __future__ import annotations

import copy as copy_module
import gc
import random
import threading
import weakref
from typing import Any

import pytest
import torch
import transformers
from conftest import IDENTITY_COUNTS
from packaging import version
from test_lossless import random_prompt
from tiny_models import ARCHITECTURES, VOCAB, own_tiny_model, tiny_model
from transformers import (
    DynamicCache,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedTokenizerFast,
    StoppingCriteria,
    StoppingCriteriaList,
    StopStringCriteria,
    TextIteratorStreamer,
    TextStreamer,
)
from transformers.generation.streamers import BaseStreamer

import specdec
from specdec.hf import HFGenerate
from specdec.models import cache_keyword
from specdec.testing import compare_outputs


def tiny_tokenizer() -> Any:
    """A word-level tokenizer over the tiny models' vocabulary: token ``i`` is the word ``w<i>``.

    The last id is the word ``abcdef`` instead: StopStringCriteria reads every token's text
    behind that word, so it must tokenize.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {f"w{i}": i for i in range(VOCAB - 1)} | {"abcdef": VOCAB - 1}
    backend = Tokenizer(models.WordLevel(words, unk_token="w2"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="w0", eos_token="w1")


# One for the module: its Generators are made once per model. budget="full" verifies every tree
# the drafter offers (no calibration); the default budget runs in the sam+recycling test.
HOOK = specdec.hf_generate("pld", budget="full")


def both(model: Any, ids: torch.Tensor, hook: HFGenerate = HOOK, **kwargs: Any) -> tuple[Any, Any]:
    """``(generate's output, specdec's output)`` of one call."""
    mask = kwargs.pop("attention_mask", torch.ones_like(ids))
    theirs = model.generate(ids, attention_mask=mask, **kwargs)
    ours = model.generate(ids, attention_mask=mask, custom_generate=hook, **kwargs)
    return theirs, ours


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_greedy_equals_generate(arch: str) -> None:
    model = tiny_model(arch)
    rng = random.Random(arch)
    for _ in range(4):
        ids = torch.tensor([random_prompt(rng)])
        theirs, ours = both(model, ids, max_new_tokens=rng.randrange(1, 50), do_sample=False)
        assert torch.equal(ours, theirs), f"{arch}: prompt {ids.tolist()}"
        IDENTITY_COUNTS[f"{arch}/hf_generate"] += 1
    assert HOOK.generator(model) is HOOK.generator(model)  # one Generator per model, reused


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_sam_recycling_and_stop_ids_equal_generate(arch: str) -> None:
    """The default drafter; EOS from generate's keyword, a list of ids; max_length instead of max_new_tokens."""
    model = tiny_model(arch)
    hook = specdec.hf_generate()
    ids = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6]])
    plain = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40, do_sample=False)
    stop = [int(plain[0, 10 + 12]), int(plain[0, 10 + 30])]  # tokens generate emits: it must stop at the first
    theirs, ours = both(model, ids, hook, max_length=50, eos_token_id=stop, do_sample=False)
    assert torch.equal(ours, theirs)
    assert ours.shape[1] < 50 and int(ours[0, -1]) in stop
    assert hook.last_result is not None and hook.last_result.stats.stop_reason == "eos"


def test_no_generated_text_is_shared_between_calls_unless_asked() -> None:
    """As specdec.run: the hook's Generator keeps no store of earlier answers; store= turns one on."""
    model = tiny_model("llama")
    ids = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8]])
    private, shared = specdec.hf_generate("sam"), specdec.hf_generate("sam", store=4096)
    for hook in (private, shared):
        theirs, ours = both(model, ids, hook, max_new_tokens=12, do_sample=False)
        assert torch.equal(ours, theirs)
    assert private.generator(model).context.store is False
    store = shared.generator(model).context.store
    assert isinstance(store, specdec.SharedStore) and store.num_tokens > 0  # it kept the answer


def test_a_dropped_model_takes_its_generators_along() -> None:
    """A hook keeps its Generator on the model, so dropping the model frees both; a copy of the model
    starts with none of its own, and a dropped hook's Generator goes too (no model kept alive)."""
    model = own_tiny_model("llama")
    hook = specdec.hf_generate("pld", budget="full")
    ids = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8]])
    theirs, ours = both(model, ids, hook, max_new_tokens=8, do_sample=False)
    assert torch.equal(ours, theirs)
    first = hook.generator(model)
    assert hook.generator(model) is first  # reused while the model lives
    copy = copy_module.deepcopy(model)
    assert hook.generator(copy) is not first and hook.generator(copy).model is copy
    other = specdec.hf_generate("pld", budget="full")
    dropped_generator = weakref.ref(other.generator(model))
    del other
    gc.collect()
    assert dropped_generator() is None
    model_ref, generator_ref = weakref.ref(model), weakref.ref(first)
    del model, first, copy
    gc.collect()
    assert model_ref() is None and generator_ref() is None
    assert hook.last_result is not None  # what the caller reads stays


def test_return_dict_in_generate() -> None:
    model = tiny_model("qwen3")
    ids = torch.tensor([[9, 8, 7, 6, 5, 9, 8, 7]])
    theirs, ours = both(model, ids, max_new_tokens=20, do_sample=False, return_dict_in_generate=True)
    assert type(ours) is type(theirs)
    assert torch.equal(ours.sequences, theirs.sequences)
    assert ours.scores is None and ours.logits is None and ours.attentions is None and ours.hidden_states is None


@pytest.mark.parametrize("arch", ["llama", "phi3"])
def test_min_new_tokens_and_min_length_equal_generate(arch: str) -> None:
    model = tiny_model(arch)
    ids = torch.tensor([[4, 4, 9, 2, 4, 4, 9, 2]])
    plain = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=30, do_sample=False)
    eos = int(plain[0, 8 + 1])  # generate would end after two new tokens, without a minimum
    for kwargs in ({"min_new_tokens": 12}, {"min_length": 8 + 7}, {"min_new_tokens": 3, "min_length": 8 + 9}):
        theirs, ours = both(model, ids, max_new_tokens=30, eos_token_id=eos, do_sample=False, **kwargs)
        assert torch.equal(ours, theirs), kwargs
        assert ours.shape[1] > 8 + 2  # the minimum held EOS back


def test_left_padding_equals_generate() -> None:
    model = tiny_model("llama")
    ids = torch.tensor([[0, 0, 0, 11, 12, 13, 11, 12, 13, 11]])
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1, 1]])
    theirs, ours = both(model, ids, attention_mask=mask, max_new_tokens=25, do_sample=False)
    assert torch.equal(ours, theirs)
    assert torch.equal(ours[0, :10], ids[0])  # the padding stays in the sequence
    # transformers >= 5.23 leaves the padding out of the repetition penalty, as specdec does;
    # older releases penalize the padding tokens too, which specdec refuses rather than ignores.
    if version.parse(transformers.__version__) >= version.parse("5.23"):
        theirs, ours = both(model, ids, attention_mask=mask, max_new_tokens=25, do_sample=False,
                            repetition_penalty=1.3)  # fmt: skip
        assert torch.equal(ours, theirs)
    else:
        with pytest.raises(specdec.SpecDecError, match="repetition_penalty over 3 padding tokens"):
            both(model, ids, attention_mask=mask, max_new_tokens=25, do_sample=False, repetition_penalty=1.3)


@pytest.mark.parametrize("drafter", ["none", "pld"])
def test_sampling_equals_specdec_plain_sampling(drafter: str) -> None:
    model = tiny_model("mistral")
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 3, 1, 4, 1]
    ids = torch.tensor([prompt])
    hook = specdec.hf_generate(drafter, seed=11)
    settings = dict(temperature=0.8, top_k=30, top_p=0.9, repetition_penalty=1.2)
    ours = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40, do_sample=True,
                          custom_generate=hook, **settings)  # fmt: skip
    plain = specdec.run(model, prompt, "none", max_new_tokens=40, do_sample=True, seed=11, **settings)
    assert ours[0, len(prompt):].tolist() == plain.tokens
    # generate's own seed= keyword wins over hf_generate's
    again = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40, do_sample=True,
                           custom_generate=hook, seed=12, **settings)  # fmt: skip
    assert again[0, len(prompt):].tolist() == specdec.run(model, prompt, "none", max_new_tokens=40,
                                                          do_sample=True, seed=12, **settings).tokens


def test_sampling_without_seed_follows_torch_manual_seed() -> None:
    model = tiny_model("gemma")
    ids = torch.tensor([[7, 7, 8, 9, 7, 7, 8, 9]])
    runs = []
    for _ in range(2):
        torch.manual_seed(5)
        runs.append(model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=30, do_sample=True,
                                   custom_generate=HOOK))  # fmt: skip
    assert torch.equal(runs[0], runs[1])
    torch.manual_seed(6)
    other = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=30, do_sample=True,
                           custom_generate=HOOK)  # fmt: skip
    assert not torch.equal(other, runs[0])  # 30 draws from a random model: equal only by a miracle


# -- streamers -------------------------------------------------------------------------------------


class Recorder(BaseStreamer):
    def __init__(self) -> None:
        self.puts: list[list[list[int]] | list[int]] = []
        self.ends = 0

    def put(self, value: torch.Tensor) -> None:
        self.puts.append(value.tolist())

    def end(self) -> None:
        self.ends += 1


def test_base_streamer_gets_prompt_then_every_token() -> None:
    model = tiny_model("gpt_neox")
    ids = torch.tensor([[20, 21, 22, 23, 20, 21, 22, 23, 20, 21]])
    recorder = Recorder()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40, streamer=recorder,
                         custom_generate=HOOK)  # fmt: skip
    assert recorder.puts[0] == ids.tolist()  # the prompt first, as generate puts it
    steps = recorder.puts[1:]
    assert all(len(step) == 1 and len(step[0]) >= 1 for step in steps)  # [1, n] per step, as assisted decoding
    assert [t for step in steps for t in step[0]] == out[0, 10:].tolist()  # type: ignore[union-attr]
    assert max(len(step[0]) for step in steps) > 1  # type: ignore[arg-type]  # multi-token steps happened
    assert recorder.ends == 1


def test_text_streamer_prints_what_generate_prints(capsys: pytest.CaptureFixture[str]) -> None:
    model, tokenizer = tiny_model("llama"), tiny_tokenizer()
    ids = torch.tensor([[30, 31, 32, 33, 30, 31, 32, 33, 30]])
    printed = []
    for hook in (None, HOOK):
        for skip_prompt in (False, True):
            extra = {} if hook is None else {"custom_generate": hook}
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=30, do_sample=False,
                           streamer=TextStreamer(tokenizer, skip_prompt=skip_prompt), **extra)  # fmt: skip
            printed.append(capsys.readouterr().out)
    assert printed[2:] == printed[:2]
    assert printed[0].startswith("w30 w31") and printed[1].strip()


def test_text_iterator_streamer_from_another_thread() -> None:
    model, tokenizer = tiny_model("qwen2"), tiny_tokenizer()
    ids = torch.tensor([[40, 41, 42, 40, 41, 42, 40, 41]])
    texts, outputs = [], []
    for hook in (None, HOOK):
        streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, timeout=120)
        kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=30, do_sample=False, streamer=streamer)
        if hook is not None:
            kwargs["custom_generate"] = hook

        def run(kwargs: dict[str, Any] = kwargs) -> None:
            outputs.append(model.generate(ids, **kwargs))

        worker = threading.Thread(target=run)
        worker.start()
        texts.append("".join(streamer))  # consumed here while generate runs in the worker
        worker.join()
    assert texts[1] == texts[0] and texts[0].strip()
    assert torch.equal(outputs[1], outputs[0])


def test_streamer_end_is_called_when_generation_fails() -> None:
    model = tiny_model("llama")
    recorder = Recorder()
    with pytest.raises(specdec.SpecDecError, match="no_repeat_ngram_size"):
        model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=5, streamer=recorder, no_repeat_ngram_size=2,
                       custom_generate=HOOK)  # fmt: skip
    assert recorder.ends == 1  # a thread reading a TextIteratorStreamer is not left waiting


# -- stopping criteria -----------------------------------------------------------------------------


def test_stop_string_criteria_equal_generate() -> None:
    model, tokenizer = tiny_model("phi3"), tiny_tokenizer()
    ids = torch.tensor([[50, 51, 52, 53, 50, 51, 52, 53]])
    plain = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40, do_sample=False)
    stop = tokenizer.convert_ids_to_tokens(int(plain[0, 8 + 15]))  # a token generate emits

    def criteria() -> StoppingCriteriaList:
        return StoppingCriteriaList([StopStringCriteria(tokenizer, [stop])])

    theirs = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40, do_sample=False,
                            stopping_criteria=criteria())  # fmt: skip
    ours = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40, do_sample=False,
                          stopping_criteria=criteria(), custom_generate=HOOK)  # fmt: skip
    assert torch.equal(ours, theirs) and ours.shape[1] <= 8 + 16
    assert HOOK.last_result is not None and HOOK.last_result.stats.stop_reason == "stop_when"


def test_max_time_equals_generate() -> None:
    model = tiny_model("llama")
    ids = torch.tensor([[5, 6, 7]])
    theirs, ours = both(model, ids, max_new_tokens=20, max_time=0.0, do_sample=False)
    assert ours.shape == theirs.shape == (1, 4)  # time is up after the first token, in both
    assert torch.equal(ours, theirs)


# -- refusals --------------------------------------------------------------------------------------


class Bias(LogitsProcessor):
    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return scores


class Never(StoppingCriteria):
    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "num_beams": ({"num_beams": 2}, "num_beams"),
    "num_return_sequences": ({"num_return_sequences": 2, "do_sample": True}, "num_return_sequences"),
    "penalty_alpha": ({"penalty_alpha": 0.6, "top_k": 4}, "penalty_alpha"),
    "dola_layers": ({"dola_layers": "low"}, "dola_layers"),
    "prompt_lookup_num_tokens": ({"prompt_lookup_num_tokens": 3}, "prompt_lookup_num_tokens"),
    "no_repeat_ngram_size": ({"no_repeat_ngram_size": 2}, "no_repeat_ngram_size"),
    "bad_words_ids": ({"bad_words_ids": [[5]]}, "bad_words_ids"),
    "sequence_bias": ({"sequence_bias": {(5,): -1.0}}, "sequence_bias"),
    "suppress_tokens": ({"suppress_tokens": [5]}, "suppress_tokens"),
    "begin_suppress_tokens": ({"begin_suppress_tokens": [5]}, "begin_suppress_tokens"),
    "forced_bos_token_id": ({"forced_bos_token_id": 5}, "forced_bos_token_id"),
    "forced_eos_token_id": ({"forced_eos_token_id": 5}, "forced_eos_token_id"),
    "exponential_decay_length_penalty": ({"exponential_decay_length_penalty": (2, 1.5), "eos_token_id": 1},
                                         "exponential_decay_length_penalty"),
    "renormalize_logits": ({"renormalize_logits": True}, "renormalize_logits"),
    "remove_invalid_values": ({"remove_invalid_values": True}, "remove_invalid_values"),
    "guidance_scale": ({"guidance_scale": 1.5}, "guidance_scale"),
    "min_p": ({"min_p": 0.1, "do_sample": True}, "min_p"),
    "typical_p": ({"typical_p": 0.5, "do_sample": True}, "typical_p"),
    "epsilon_cutoff": ({"epsilon_cutoff": 0.01, "do_sample": True}, "epsilon_cutoff"),
    "eta_cutoff": ({"eta_cutoff": 0.01, "do_sample": True}, "eta_cutoff"),
    "output_scores": ({"output_scores": True, "return_dict_in_generate": True}, "output_scores"),
    "output_logits": ({"output_logits": True, "return_dict_in_generate": True}, "output_logits"),
    "output_attentions": ({"output_attentions": True, "return_dict_in_generate": True}, "output_attentions"),
    "output_hidden_states": ({"output_hidden_states": True, "return_dict_in_generate": True},
                             "output_hidden_states"),
    "prefix_allowed_tokens_fn": ({"prefix_allowed_tokens_fn": lambda batch, ids: list(range(VOCAB))},
                                 "prefix_allowed_tokens_fn"),
    "logits_processor": ({"logits_processor": LogitsProcessorList([Bias()])}, "Bias"),
    "stopping_criteria": ({"stopping_criteria": StoppingCriteriaList([Never()])}, "Never"),
    "seed without sampling": ({"seed": 3}, "seed=3"),
    "filled cache": ({"cache": "filled"}, "starts from an empty cache"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_options_are_refused(case: str) -> None:
    model = tiny_model("llama")
    kwargs, named = REFUSED[case]
    kwargs = dict(kwargs)
    ids = torch.tensor([[3, 4, 5, 6]])
    if kwargs.pop("cache", None) == "filled":
        cache = DynamicCache(config=model.config)
        keyword = cache_keyword(model)  # generate names it as the model's forward does
        model(input_ids=ids[:, :2], use_cache=True, **{keyword: cache})
        kwargs[keyword] = cache
    with pytest.raises(specdec.SpecDecError) as error:
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, custom_generate=HOOK, **kwargs)
    assert named in str(error.value)


@pytest.mark.parametrize("drafter", ["sam+recycling", "model", "sam+model"])
def test_assistant_model_drafts_with_the_model_drafter(drafter: str) -> None:
    model, assistant = tiny_model("llama"), tiny_model("llama", seed=1)
    ids = torch.tensor([[3, 4, 5, 3, 4]])
    hook = specdec.hf_generate(drafter, budget="full")
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, assistant_model=model,
                         custom_generate=hook)  # fmt: skip
    plain = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
    assert out.tolist() == plain.tolist()
    assert hook.last_result is not None and hook.last_result.stats.mat > 1.0  # the target drafting for itself
    generator = hook.generator(model, ("model", model))
    expected = "model" if drafter == "sam+recycling" else drafter
    assert generator._drafters.spec == expected
    assert hook.generator(model, ("model", assistant)) is not generator  # another assistant: another Generator
    assert hook.generator(model, ("model", assistant)) is hook.generator(model, ("model", assistant))


def test_assistant_early_exit_drafts_with_the_early_exit_drafter() -> None:
    model = tiny_model("llama")
    ids = torch.tensor([[7, 8, 9, 10]])
    hook = specdec.hf_generate(budget="full")
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, assistant_early_exit=2,
                         custom_generate=hook)  # fmt: skip
    plain = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
    assert out.tolist() == plain.tolist()
    assert hook.last_result is not None and hook.last_result.stats.mat > 1.0  # every layer: the target's own


def test_an_assistant_and_another_drafter_conflict() -> None:
    model = tiny_model("llama")
    with pytest.raises(specdec.SpecDecError, match="assistant_model drafts with drafter 'model'.*'pld'"):
        model.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=5, assistant_model=tiny_model("llama", seed=1),
                       custom_generate=specdec.hf_generate("pld"))  # fmt: skip
    with pytest.raises(specdec.SpecDecError, match="not both"):
        model.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=5, assistant_model=model, assistant_early_exit=1,
                       custom_generate=HOOK)  # fmt: skip


def test_batches_inputs_embeds_and_masks_with_holes_are_refused() -> None:
    model = tiny_model("llama")
    batch = torch.tensor([[3, 4, 5], [6, 7, 8]])
    with pytest.raises(specdec.SpecDecError, match="issue #32"):
        model.generate(batch, attention_mask=torch.ones_like(batch), max_new_tokens=5, custom_generate=HOOK)
    ids = torch.tensor([[3, 4, 5, 6]])
    with pytest.raises(specdec.SpecDecError, match="left padding only"):
        model.generate(ids, attention_mask=torch.tensor([[1, 0, 1, 1]]), max_new_tokens=5, custom_generate=HOOK)
    embeds = model.get_input_embeddings()(ids)
    with pytest.raises(specdec.SpecDecError, match="inputs_embeds"):
        model.generate(inputs_embeds=embeds, attention_mask=torch.ones_like(ids), max_new_tokens=5,
                       custom_generate=HOOK)  # fmt: skip


def test_hf_generate_options_are_checked() -> None:
    with pytest.raises(specdec.SpecDecError, match=r"max_new_tokens is decided by the model.generate call"):
        specdec.hf_generate("pld", max_new_tokens=5)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="bogus"):
        specdec.hf_generate("pld", bogus=1)  # type: ignore[call-arg]
    with pytest.raises(specdec.SpecDecError, match="unknown drafter"):
        model = tiny_model("llama")
        model.generate(torch.tensor([[3, 4]]), max_new_tokens=3, custom_generate=specdec.hf_generate("nope"))


# -- the default model -----------------------------------------------------------------------------


@pytest.mark.slow
def test_default_model_equals_generate_with_a_streamer(
    default_model: tuple[Any, Any], spec_bench_prompts: dict[str, list[list[int]]]
) -> None:
    """SmolLM2 in fp32, the default drafter, a streamer: identical to generate, or a first difference on a near-tie."""
    model, tokenizer = default_model
    hook = specdec.hf_generate("sam+recycling", tokenizer=tokenizer)
    report = []
    for category, prompts in sorted(spec_bench_prompts.items())[::2]:  # every other category: CI's 30 minutes
        prompt = prompts[2]
        ids = torch.tensor([prompt])
        theirs = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=48, do_sample=False)
        recorder = Recorder()
        ours = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=48, do_sample=False,
                              streamer=recorder, custom_generate=hook)  # fmt: skip
        assert recorder.puts[0] == ids.tolist() and recorder.ends == 1
        assert [t for step in recorder.puts[1:] for t in step[0]] == ours[0, len(prompt) :].tolist()  # type: ignore[union-attr]
        comparison = compare_outputs(model, prompt, ours[0, len(prompt) :].tolist(), theirs[0, len(prompt) :].tolist())
        report.append(f"{category}: {comparison.describe()}")
        assert comparison.acceptable, f"{category}: {comparison.describe()}"
        IDENTITY_COUNTS["smollm2/hf_generate sam+recycling" + ("" if comparison.identical else " (near-tie)")] += 1
    print("\nhf_generate vs generate: " + "; ".join(report))
