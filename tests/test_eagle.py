"""The EAGLE head drafter (``eagle``, ``sam+eagle``): lossless, its cache in step, its file checked, its features.

On tiny random fp64 models (tests/tiny_models.py) with a randomly initialised head, the output must
equal plain decoding token for token on every CPU engine (the ones that hand the drafter the
target's features, and the buckets, where the drafter computes them itself), and sampling must
equal plain sampling under the same seed. The head's cache must hold exactly what a cache-free
run over the committed sequence would compute; the head file must refuse what it cannot serve.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_lossless import hf_greedy, random_prompt
from tiny_models import VOCAB, own_tiny_model, tiny_model

import specdec
from specdec.backends import make_verifier
from specdec.drafters import make_factory
from specdec.drafters.base import DrafterContext
from specdec.drafters.eagle import EagleConfig, EagleDrafter, TargetFeatures
from specdec.drafters.eagle_head import EagleHead, HeadFileError, head_metadata, load_head, save_head
from specdec.errors import SpecDecError
from specdec.types import DraftTree, Feedback

ARCHS = ("llama", "qwen2", "gemma", "mistral", "qwen3")
RUNNER_ARCHS = ("llama", "qwen2")  # the ones engine="specdec" runs
ENGINES = ("hf", "specdec", "buckets")
_HEADS: dict[str, EagleHead] = {}


def random_head(arch: str) -> EagleHead:
    """A head for ``arch``'s tiny target with random weights (spread wide, so drafts vary)."""
    if arch not in _HEADS:
        torch.manual_seed(11)
        head = EagleHead(tiny_model(arch))
        with torch.no_grad():
            for parameter in head.parameters():
                if parameter.dim() >= 2:
                    parameter.normal_(0.0, 0.3)
        _HEADS[arch] = head.eval()
    return _HEADS[arch]


def bf16_head(arch: str) -> EagleHead:
    """:func:`random_head`'s weights in bfloat16 (what ``dtype="auto"`` runs for a float32 target on a CPU)."""
    head = EagleHead(tiny_model(arch), dtype=torch.bfloat16)
    head.load_state_dict(random_head(arch).state_dict())
    return head.eval()


def cases() -> list[tuple[str, str]]:
    return [(arch, engine) for arch in ARCHS for engine in ENGINES if engine != "specdec" or arch in RUNNER_ARCHS]


@pytest.mark.parametrize(("arch", "engine"), cases())
def test_eagle_matches_plain_greedy(arch: str, engine: str) -> None:
    target = tiny_model(arch)
    head = random_head(arch)
    rng = random.Random(f"eagle-{arch}-{engine}")
    drafted = 0
    for drafter, options in [("eagle", {"head": head}), ("eagle", {"head": head, "topk": 3, "depth": 4}),
                             ("sam+eagle", {"eagle.head": head}), ("eagle", {"head": bf16_head(arch)})]:  # fmt: skip
        prompt = random_prompt(rng)
        max_new = rng.randrange(10, 40)
        result = specdec.run(target, prompt, drafter, drafter_options=options, max_new_tokens=max_new,
                             budget="full", engine=engine)  # fmt: skip
        assert result.tokens == hf_greedy(target, prompt, max_new), f"{arch}/{engine}/{drafter} {options}: {prompt}"
        drafted += sum(r.tree_size - 1 for r in result.stats.records)
    assert drafted > 0  # regression guard: something was drafted and verified


def test_eagle_in_a_batch_equals_each_row_alone() -> None:
    target = tiny_model("llama")
    rng = random.Random("eagle-batch")
    prompts = [random_prompt(rng) for _ in range(3)]
    results = specdec.run_batch(target, prompts, "eagle", drafter_options={"head": random_head("llama")},
                                batch_size=3, max_new_tokens=20, budget="full", engine="specdec")  # fmt: skip
    assert [r.tokens for r in results] == [hf_greedy(target, p, 20) for p in prompts]


def test_eagle_under_the_auto_budget_matches_plain_greedy() -> None:
    target = tiny_model("llama")
    prompt = [5, 9, 2, 5, 9, 2, 7, 7, 1, 30]
    result = specdec.run(target, prompt, "sam+eagle", drafter_options={"eagle.head": random_head("llama")},
                         max_new_tokens=30)  # fmt: skip
    assert result.tokens == hf_greedy(target, prompt, 30)


@pytest.mark.parametrize("arch", ["llama", "gemma"])
def test_sampling_equals_plain_sampling(arch: str) -> None:
    target = tiny_model(arch)
    prompt = [4, 8, 15, 16, 23, 42]
    for seed in (3, 4):
        options: dict[str, Any] = dict(max_new_tokens=25, temperature=0.8, top_k=20, seed=seed)
        plain = specdec.run(target, prompt, "none", **options).tokens
        for drafter, drafter_options in [("eagle", {"head": random_head(arch)}),
                                         ("sam+eagle", {"eagle.head": random_head(arch)})]:  # fmt: skip
            result = specdec.run(target, prompt, drafter, drafter_options=drafter_options, budget="full", **options)
            assert result.tokens == plain, f"{arch}/{drafter} seed {seed}"


# -- the features channel ------------------------------------------------------------------------------
@pytest.mark.parametrize("engine", ["hf", "specdec"])
def test_the_verifier_hands_over_the_lm_heads_input(engine: str) -> None:
    """Feedback.features are the LM head's input: the head of them gives the logits the step decided from."""
    target = tiny_model("llama")
    verifier = make_verifier(target, engine=engine)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    state, pending, feedback = verifier.prefill(prompt, features=True)
    assert feedback is not None and feedback.features is not None
    assert feedback.features.shape == (len(prompt), target.config.hidden_size) and feedback.topk.shape == (8, 0)
    with torch.no_grad():
        reference = target.model(input_ids=torch.tensor([prompt])).last_hidden_state[0]
    torch.testing.assert_close(feedback.features, reference, rtol=0, atol=1e-12)
    tree = DraftTree((pending, 7, 8, 9), (-1, 0, 0, 1))
    result = verifier.verify(state, tree, features=True)
    assert result.feedback is not None and result.feedback.features.shape == (4, target.config.hidden_size)
    with torch.no_grad():
        plain = verifier.verify(verifier.prefill(prompt)[0], tree)
    assert plain.feedback is None and (result.accepted_nodes, result.bonus) == (plain.accepted_nodes, plain.bonus)


# -- the head's cache stays in step --------------------------------------------------------------------
def scratch_root_logp(head: EagleHead, target: Any, sequence: list[int]) -> torch.Tensor:
    """The head's log-probabilities after ``sequence`` (committed + pending) computed with no cache: features of
    every committed position by the target's forward, every pair in one causal forward."""
    with torch.no_grad():
        features = target.model(input_ids=torch.tensor([sequence[:-1]])).last_hidden_state  # [1, C, H]
        tokens = torch.tensor([sequence[1:]])
        positions = torch.arange(len(sequence) - 1)[None]
        predicted = head(features, tokens, positions)  # causal, no cache
        return torch.log_softmax(head.logits(predicted[0, -1]).float(), dim=-1)


@settings(max_examples=10, deadline=None)
@given(
    prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12),
    steps=st.lists(st.tuples(st.booleans(), st.integers(0, 3), st.integers(0, VOCAB - 1)), min_size=1, max_size=5),
    verifier_features=st.booleans(),
)
def test_the_head_cache_stays_in_step(prompt: list[int], steps: list[tuple[bool, int, int]],
                                      verifier_features: bool) -> None:  # fmt: skip
    """Whatever is accepted (a path of the tree, then a bonus), and on steps that draft nothing, each proposal's
    root children are the top-k of a cache-free run of the head over the committed sequence; features from the
    verifier or computed by the drafter itself alike."""
    target = tiny_model("llama")
    head = random_head("llama")
    drafter = EagleDrafter(head, EagleConfig(head=head, topk=4, depth=3, num_nodes=12), TargetFeatures(target))
    verifier = make_verifier(target, engine="hf")
    state, _, feedback = verifier.prefill(prompt, features=verifier_features)
    drafter.reset(prompt, feedback)
    committed, pending = list(prompt), prompt[-1]
    for proposes, accept, bonus in steps:
        tree = DraftTree.single(pending)
        if proposes:
            tree = drafter.propose(pending, 16)
            expected = scratch_root_logp(head, target, [*committed, pending])
            children = [tree.tokens[i] for i in range(1, tree.size) if tree.parents[i] == 0]
            top = [int(t) for t in torch.topk(expected, 4).indices]
            assert sorted(children) == sorted(top[: len(children)]) and children, (children, top)
            assert int(drafter.cache.get_seq_length()) == len(committed) - 1  # the root and tree pairs cropped
        path = [0]
        while len(path) <= accept:
            kids = [i for i in range(tree.size) if tree.parents[i] == path[-1]]
            if not kids:
                break
            path.append(kids[0])
        # The features of the walked nodes, as the verifier computes them (the nodes' own forward).
        sequence = [*committed, *(tree.tokens[i] for i in path)]
        with torch.no_grad():
            features = target.model(input_ids=torch.tensor([sequence])).last_hidden_state[0, len(committed):]
        rows = torch.zeros(tree.size, features.shape[1], dtype=features.dtype)
        rows[path] = features
        accepted = [tree.tokens[i] for i in path]
        drafter.update(accepted, Feedback(torch.tensor(tree.tokens).numpy(), torch.zeros(tree.size, 0).long().numpy(),
                                          tuple(path), rows if verifier_features else None))  # fmt: skip
        committed += accepted
        pending = bonus
    verifier.release(state)


def test_drafts_are_best_first_trees_within_the_budget() -> None:
    target = tiny_model("llama")
    head = random_head("llama")
    drafter = EagleDrafter(head, EagleConfig(head=head, topk=5, depth=4, num_nodes=20), TargetFeatures(target))
    drafter.reset([3, 4, 5, 6])
    tree = drafter.propose(7, 64)
    assert tree.size == 20 and tree.source == "eagle" and max(tree.depths) <= 4
    assert tree.node_features is not None and list(tree.node_features[1:]) == sorted(tree.node_features[1:])
    assert drafter.propose(7, 6).size == 6  # the engine's cap
    assert drafter.propose(7, 1).size == 1


# -- the head file ------------------------------------------------------------------------------------
def test_a_head_file_round_trips(tmp_path: Path) -> None:
    target = tiny_model("llama")
    head = random_head("llama")
    path = tmp_path / "head.safetensors"
    save_head(head, target, path, {"note": "test"})
    loaded = load_head(path, target)
    for name, tensor in head.own_state().items():
        torch.testing.assert_close(loaded.own_state()[name], tensor.to(torch.float16).to(tensor.dtype))
    assert torch.equal(loaded.draft_vocab, head.draft_vocab)
    assert head_metadata(path)["trained"] == {"note": "test"}
    assert "embed_tokens.weight" not in str(list(loaded.own_state()))  # the target's weights are not stored


def _corrupt(tmp_path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> Path:
    from safetensors.torch import save_file

    path = tmp_path / "bad.safetensors"
    save_file(tensors, str(path), metadata=metadata)
    return path


def test_malformed_head_files_are_refused_by_name(tmp_path: Path) -> None:
    from safetensors import safe_open

    target = tiny_model("llama")
    good = tmp_path / "good.safetensors"
    save_head(random_head("llama"), target, good, {})
    with safe_open(str(good), framework="pt") as handle:
        metadata = dict(handle.metadata())
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118 (not a dict)
    cases = [
        ({**metadata, "hidden_size": "64"}, tensors, "hidden_size = '64'"),
        ({**metadata, "vocab_size": "100"}, tensors, "vocab_size = '100'"),
        ({**metadata, "num_hidden_layers": "3"}, tensors, "num_hidden_layers = '3'"),
        ({**metadata, "version": "9"}, tensors, "format version '9'"),
        ({**metadata, "format": "x"}, tensors, "not an EAGLE head file"),
        (metadata, {k: v for k, v in tensors.items() if k != "fc.weight"}, "missing 'fc.weight'"),
        (metadata, {**tensors, "fc.weight": tensors["fc.weight"][:, :3].contiguous()}, "fc.weight has shape"),
        (metadata, {**tensors, "draft_vocab": torch.tensor([0, VOCAB])}, "outside"),
    ]
    for bad_metadata, bad_tensors, message in cases:
        with pytest.raises(HeadFileError, match=message):
            load_head(_corrupt(tmp_path, bad_tensors, bad_metadata), target)
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(HeadFileError, match="truncated"):
        load_head(truncated, target)
    with pytest.raises(HeadFileError, match="does not exist"):
        load_head(tmp_path / "nowhere.safetensors", target)
    with pytest.raises(HeadFileError, match="model_type = 'llama', and this target has 'gemma'"):
        load_head(good, tiny_model("gemma"))  # another target


def test_the_eagle_drafter_needs_a_target_and_a_head() -> None:
    with pytest.raises(SpecDecError, match="no target model"):
        make_factory("eagle", {}, DrafterContext(vocab_size=VOCAB))
    with pytest.raises(SpecDecError, match="head must be a head file"):
        make_factory("eagle", {"head": 3}, DrafterContext(vocab_size=VOCAB, model=tiny_model("llama")))
    with pytest.raises(HeadFileError, match="was trained for a target"):  # the default model's head, a tiny target
        make_factory("eagle", {}, DrafterContext(vocab_size=VOCAB, model=tiny_model("llama")))


# -- training --------------------------------------------------------------------------------------------
def test_training_a_head_writes_a_loadable_file(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    from specdec.drafters.eagle_train import TrainConfig, extract, train

    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    target = own_tiny_model("llama").float()  # a copy: training freezes the target's weights
    rng = random.Random(0)
    windows = [[rng.randrange(VOCAB) for _ in range(32)] for _ in range(12)]
    config = TrainConfig(tokens=12 * 32, window=32, epochs=3, draft_vocab=64, lr=3e-3)
    data = extract(target, windows[:10], config)
    assert extract(target, windows[:10], config)[1].shape == (10, 32, 32)  # the second call reads the cache
    assert len(list((tmp_path / "eagle-features").iterdir())) == 1
    head, result = train(target, config, data, extract(target, windows[10:], config), log=lambda line: None)
    assert 0.0 <= result["valid_top1"] <= 1.0 and head.draft_vocab.numel() == 64
    save_head(head, target, tmp_path / "h.safetensors", {"result": result})
    assert load_head(tmp_path / "h.safetensors", target).draft_vocab.numel() == 64
