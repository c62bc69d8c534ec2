"""The static-cache verifier: token identity, cache bookkeeping, modes, errors (issues 14 and 17).

Every generation here is compared with plain greedy decoding (Hugging Face's ``generate``)
on tiny fp64 models, where no rounding can flip a choice, so identity is demanded
outright. ``static-eager`` runs the same static cache, padding, in-forward mask and
compaction as the compiled and graph modes, without compiling: it is what CI can afford
for every architecture. ``static-inductor`` is compiled once per bucket, so it is tested
on one architecture with two buckets; ``cudagraphs`` needs a GPU (skipped here with the
reason, run by ``scripts/gpu_check.sh``).
"""

from __future__ import annotations

import random

import pytest
import torch
from conftest import IDENTITY_COUNTS
from oracle_drafter import OracleTreeDrafter
from test_lossless import hf_greedy, random_prompt
from tiny_models import ARCHITECTURES, VOCAB, own_tiny_model, tiny_model

import specdec
from specdec.backends import engine_for_cache, make_verifier, resolve_engine
from specdec.backends.buckets.forward import BucketForward, bucket_verifier
from specdec.backends.buckets.sizes import BUCKETS, WINDOW_STEP, bucket_for
from specdec.backends.slot_cache import StaticKVCache, capacity_for
from specdec.budget.calibration import calibrate
from specdec.decoding import DecodingConfig, StopRules
from specdec.engine import decode
from specdec.errors import SpecDecError
from specdec.types import DraftTree

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


@pytest.mark.parametrize("attn", ["sdpa", pytest.param("eager", marks=pytest.mark.slow)])  # eager: 8-26 s each
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_static_eager_random_trees_match_plain_greedy(arch: str, attn: str) -> None:
    """Deep accepted paths and scattered slots through padding, the in-forward mask and compaction."""
    model = tiny_model(arch, attn)
    rng = random.Random(f"static-{arch}")
    generator = specdec.Generator(model, drafter="none", engine="buckets", budget="full")
    for seed in range(3):
        prompt = random_prompt(rng)
        truth = hf_greedy(model, prompt, 50)
        drafter = OracleTreeDrafter(truth, VOCAB, seed=seed, size=20, depth=7)
        result = specdec.run(model, prompt, drafter, max_new_tokens=50, budget="full", engine="buckets")
        assert result.tokens == truth
        assert result.stats.mat > 1.0
        # The same Generator serves every prompt: one cache, reused runners.
        assert generator.generate(prompt, max_new_tokens=50).tokens == truth
        IDENTITY_COUNTS[f"{arch}/oracle-tree/static-eager/{attn}"] += 1
    assert isinstance(generator.verifier.forward, BucketForward)
    assert set(generator.verifier.forward._runners) == {1}  # plain decoding only ever used the one-node bucket


@pytest.mark.parametrize("drafter", ["none", "pld", "recycling", "sam", "sam+recycling"])
@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma"])
def test_static_eager_drafters_match_plain_greedy(arch: str, drafter: str) -> None:
    model = tiny_model(arch)
    rng = random.Random(f"static-drafters-{arch}-{drafter}")
    for _ in range(3):
        prompt = random_prompt(rng)
        max_new = rng.randrange(1, 60)
        expected = hf_greedy(model, prompt, max_new)
        result = specdec.run(model, prompt, drafter, max_new_tokens=max_new, engine="buckets", budget="full")
        assert result.tokens == expected, f"{arch}/{drafter}: prompt {prompt}"
        IDENTITY_COUNTS[f"{arch}/{drafter}/static-eager"] += 1


def test_cache_grows_for_a_longer_request_and_keeps_identity() -> None:
    model = tiny_model("llama")
    short = [5, 6, 7, 8] * 3
    # The budget's cost model first, on a verifier of its own, kept alive so that its grown cache is not pooled for
    # the one under test: measuring the cost prefills 1,024 tokens, which would grow the cache under test before
    # its first request (it is measured, not read, where no cached one exists: a busy machine caches none).
    calibrated = specdec.Generator(model, drafter="pld", engine="buckets", budget="full")
    calibrated.generate(short, max_new_tokens=20)  # long enough to plan a draft, which needs the cost
    generator = specdec.Generator(model, drafter="pld", engine="buckets", budget="full")
    verifier = generator.verifier
    assert isinstance(verifier.forward, BucketForward)
    assert generator.generate(short, max_new_tokens=20).tokens == hf_greedy(model, short, 20)
    first_capacity = verifier.forward.cache.capacity
    long = [rng_token % VOCAB for rng_token in range(7, 7 + 150)]  # 150 + 100 + 128 slots: more than 256
    assert generator.generate(long, max_new_tokens=100).tokens == hf_greedy(model, long, 100)
    assert verifier.forward.cache.capacity > first_capacity
    assert verifier.forward.cache.capacity == capacity_for(verifier.forward.cache.capacity) >= 256  # a power of two
    # Back to a short prompt: the larger cache stays (no shrink, no new allocation).
    capacity, generation = verifier.forward.cache.capacity, verifier.forward.cache.generation
    assert generator.generate(short, max_new_tokens=20).tokens == hf_greedy(model, short, 20)
    assert (verifier.forward.cache.capacity, verifier.forward.cache.generation) == (capacity, generation)
    del calibrated


def test_compaction_moves_exactly_the_accepted_slots() -> None:
    torch.manual_seed(0)
    cache = StaticKVCache(num_layers=3, capacity=32, device=torch.device("cpu"))
    cache.allocate_like(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4))
    assert cache.keys is not None and cache.values is not None
    for tensor in (*cache.keys, *cache.values):
        tensor.normal_()
    before = [t.clone() for t in (*cache.keys, *cache.values)]
    committed, path = 10, (0, 2, 5, 6)
    cache.compact(committed, path)
    for tensor, old in zip((*cache.keys, *cache.values), before, strict=True):
        for i, node in enumerate(path):
            assert torch.equal(tensor[:, :, committed + i], old[:, :, committed + node])
        assert torch.equal(tensor[:, :, :committed], old[:, :, :committed])  # the committed prefix is kept
    chain = [t.clone() for t in (*cache.keys, *cache.values)]
    cache.compact(committed, (0, 1, 2))  # a chain is in place already: nothing moves
    assert all(torch.equal(t, c) for t, c in zip((*cache.keys, *cache.values), chain, strict=True))


def test_calibration_inside_a_sequence_leaves_it_intact() -> None:
    """The planner calibrates at a sequence's first draft: the sequence must go on as if nothing happened."""
    model = tiny_model("qwen2")
    prompt = [3, 9, 27, 81 % VOCAB, 50, 12, 3, 9, 27]
    truth = hf_greedy(model, prompt, 40)
    verifier = bucket_verifier(model, engine="buckets")
    state, pending, _ = verifier.prefill(prompt, reserve=40)
    out = [pending]
    for token in truth[1:20]:  # the truth as a chain of one: 19 plain steps
        result = verifier.verify(state, DraftTree.single(out[-1]))
        assert result.bonus == token
        out.append(result.bonus)
    table = calibrate(verifier, sizes=(1, 2, 4), contexts=(8, 30), repeats=1)
    assert table.bucketed and table.sizes == (1, 2, 4)
    while len(out) < 40:
        result = verifier.verify(state, DraftTree.chain(out[-1], truth[len(out) : len(out) + 3]))
        out.extend([*result.accepted_tokens[1:], result.bonus])
    assert out[:40] == truth


@pytest.mark.slow  # inductor compiles (warm compiled cache: ~20 s; cold: minutes)
def test_inductor_mode_matches_plain_greedy_and_leaves_the_model_alone() -> None:
    model = tiny_model("llama")
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    implementation = model.config._attn_implementation
    verifier = bucket_verifier(model, engine="compiled", buckets=(1, 8))
    rng = random.Random(3)
    for drafter in ("none", "recycling"):
        prompt = random_prompt(rng)
        truth = hf_greedy(model, prompt, 30)
        result = decode(verifier, specdec.make_factory(drafter).create(), prompt, DecodingConfig(StopRules(30)))
        assert result.tokens == truth, drafter
        IDENTITY_COUNTS[f"llama/{drafter}/static-inductor"] += 1
    assert set(verifier.forward._runners) == {1, 8}
    assert all(runner._compiled is not None for runner in verifier.forward._runners.values())
    # Compiled once per bucket: later steps reuse it.
    prompt = random_prompt(rng)
    with torch._dynamo.config.patch(error_on_recompile=True):
        recycling = specdec.make_factory("recycling").create()
        assert decode(verifier, recycling, prompt, DecodingConfig(StopRules(20))).tokens == hf_greedy(model, prompt, 20)
    # Nothing compiled or patched lives on the model: its forward and generate are as before.
    assert "forward" not in model.__dict__ and not any("forward" in m.__dict__ for m in model.modules())
    assert model.config._attn_implementation == implementation
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())
    prompt = [4, 8, 15, 16, 23, 42]
    assert hf_greedy(model, prompt, 10) == decode(verifier, specdec.make_factory("none").create(), prompt,
                                                  DecodingConfig(StopRules(10))).tokens


@pytest.mark.parametrize("engine", ["buckets", pytest.param("compiled", marks=pytest.mark.slow)])  # inductor compiles
def test_forwards_attend_over_a_window_that_widens_without_recompiling(engine: str) -> None:
    """A bucket attends over the leading ``WINDOW_STEP``-multiple of slots the sequence has reached, not
    the whole cache; the window's width is a dynamic size of the compiled forward, so a sequence that
    crosses into wider windows reuses the bucket's one compiled graph, and stays identical."""
    model = tiny_model("qwen2")
    verifier = bucket_verifier(model, engine=engine, buckets=(1, 4))
    mode = verifier.forward.mode
    rng = random.Random(11)
    prompt = random_prompt(rng)[:20]
    result = decode(verifier, specdec.make_factory("pld").create(), prompt, DecodingConfig(StopRules(20)))
    assert result.tokens == hf_greedy(model, prompt, 20)
    widths = sorted(verifier.forward.held.windows)
    assert widths and all(w % WINDOW_STEP == 0 and w < verifier.forward.cache.capacity for w in widths), widths
    prompt = random_prompt(rng)[:20]
    with torch._dynamo.config.patch(error_on_recompile=True):
        result = decode(verifier, specdec.make_factory("pld").create(), prompt, DecodingConfig(StopRules(150)))
    assert result.tokens == hf_greedy(model, prompt, 150)
    IDENTITY_COUNTS[f"qwen2/pld/static-{mode}+windows"] += 2
    wider = sorted(set(verifier.forward.held.windows) - set(widths))
    assert len(wider) >= 2, (widths, wider)  # the second sequence crossed at least two window edges
    widest = verifier.forward._window_for(10**6, mode)
    assert widest is not None and widest.shape[0] == verifier.forward.cache.capacity  # never wider than the cache
    assert verifier.forward._window_for(10, "cudagraphs") is None  # a captured graph has one shape: the whole cache


@pytest.mark.slow  # inductor compiles, twice
def test_inductor_mode_recompiles_after_an_in_place_weight_update() -> None:
    """Compiled forwards hold frozen weights; an in-place update must not be served stale."""
    from tiny_models import _configs  # a private copy: the cached tiny model must stay as it is
    from transformers import AutoModelForCausalLM

    config = _configs()["qwen3"]
    config._attn_implementation = "sdpa"
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float64).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2:
                parameter.normal_(0.0, 0.3)
    model.generation_config.eos_token_id = None  # as tiny_model does: plain decoding runs the full length
    model.generation_config.pad_token_id = 0
    verifier = bucket_verifier(model, engine="compiled", buckets=(1,))
    prompt = [7, 3, 9, 1, 4]
    first = decode(verifier, specdec.make_factory("none").create(), prompt, DecodingConfig(StopRules(12))).tokens
    assert first == hf_greedy(model, prompt, 12)
    with torch.no_grad():
        model.lm_head.weight.mul_(-1.0)  # in place: the version counter moves
    second = decode(verifier, specdec.make_factory("none").create(), prompt, DecodingConfig(StopRules(12))).tokens
    assert second == hf_greedy(model, prompt, 12)
    assert second != first


def test_a_later_prefill_takes_the_cache() -> None:
    model = tiny_model("llama")
    verifier = bucket_verifier(model, engine="buckets")
    state, pending, _ = verifier.prefill([1, 2, 3])
    verifier.prefill([4, 5, 6])
    with pytest.raises(SpecDecError, match="taken by a later prefill"):
        verifier.verify(state, DraftTree.single(pending))


def test_engine_names_are_checked_and_auto_resolves() -> None:
    model = tiny_model("llama")
    with pytest.raises(SpecDecError, match="unknown engine 'stattic'.*valid names: auto, hf, specdec, buckets"):
        make_verifier(model, "stattic")
    with pytest.raises(SpecDecError, match="unknown engine"):
        specdec.run(model, [1, 2, 3], "pld", engine="static-turbo", max_new_tokens=2)
    with pytest.raises(SpecDecError, match="engine 'graphs' needs a model on a CUDA device"):
        make_verifier(model, engine="graphs")
    with pytest.raises(SpecDecError, match="buckets must include 1"):
        bucket_verifier(model, engine="buckets", buckets=(2, 4))
    assert resolve_engine("auto", torch.device("cpu"), model) == "specdec"  # specdec's own forward runs llama
    assert resolve_engine("auto", torch.device("cpu"), tiny_model("gpt2")) == "hf"  # it does not run gpt2
    assert resolve_engine("auto", torch.device("cuda"), model) == "graphs"
    for engine, kind in [("hf", "HFForward"), ("specdec", "SpecdecForward"), ("buckets", "BucketForward")]:
        verifier = make_verifier(model, engine)
        assert type(verifier).__name__ == "ModelVerifier" and type(verifier.forward).__name__ == kind
        assert verifier.engine == engine


def test_former_cache_names_map_to_engines_with_a_deprecation_warning() -> None:
    """``cache=`` and ``backend=`` still work, each with a DeprecationWarning that names the new spelling."""
    model, gpt2 = tiny_model("llama"), tiny_model("gpt2")
    # "static" named no mode: specdec's own forward on a CPU where it runs the model, else the compiled buckets
    assert engine_for_cache("static", model) == "specdec" and engine_for_cache("static", gpt2) == "compiled"
    assert [engine_for_cache(c) for c in ("auto", "dynamic", "native", "static-eager", "static-inductor",
                                          "static-cudagraphs", "static-inductor-cudagraphs")] == [
        "auto", "hf", "specdec", "buckets", "compiled", "graphs", "compiled-graphs"]  # fmt: skip
    with pytest.raises(SpecDecError, match="unknown cache 'stattic'"):
        engine_for_cache("stattic")
    with pytest.warns(DeprecationWarning, match="cache='dynamic' is deprecated: pass engine='hf'") as caught:
        generator = specdec.Generator(model, drafter="none", cache="dynamic")
    assert generator.verifier.engine == "hf" and caught[0].filename == __file__  # the user's line, not specdec's
    with pytest.warns(DeprecationWarning, match="cache='static' is deprecated: pass engine='specdec'"):
        assert specdec.run(model, [1, 2, 3], "none", cache="static", max_new_tokens=2).stats.engine == "specdec"
    with pytest.warns(DeprecationWarning, match="backend='torch' is deprecated.*tree_ops='torch'"):
        assert specdec.Generator(model, drafter="none", backend="torch").verifier.name == "torch"
    with pytest.raises(SpecDecError, match="give engine= alone"):
        specdec.Generator(model, drafter="none", engine="hf", cache="dynamic")
    with pytest.raises(TypeError, match="tree_ops"):  # an override of the Generator's, not a knob of run
        specdec.run(model, [1, 2, 3], "none", tree_ops="torch")  # type: ignore[call-arg]
    with pytest.raises(SpecDecError, match="exceeds the largest bucket"):
        bucket_for(BUCKETS[-1] + 1)


def test_trees_are_capped_at_the_largest_bucket() -> None:
    model = tiny_model("phi3")
    prompt = [9, 8, 7, 6, 5, 4, 3, 2] * 3
    truth = hf_greedy(model, prompt, 30)
    verifier = bucket_verifier(model, engine="buckets", buckets=(1, 2, 4))
    drafter = OracleTreeDrafter(truth, VOCAB, seed=0, size=20, depth=7)
    result = decode(verifier, drafter, prompt, DecodingConfig(StopRules(30)))
    assert result.tokens == truth
    assert max(record.tree_size for record in result.stats.records) <= 4


@cuda
@pytest.mark.parametrize("engine", ["graphs", "compiled-graphs"])
def test_cuda_graph_engines_match_plain_greedy(engine: str) -> None:
    model = own_tiny_model("llama").to("cuda")  # a copy: the cached model stays on the CPU
    try:
        rng = random.Random(engine)
        generator = specdec.Generator(model, drafter="none", engine=engine, budget="full")
        for seed in range(2):
            prompt = random_prompt(rng)
            ids = torch.tensor([prompt], device="cuda")
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40, do_sample=False)
            expected = [int(t) for t in out[0, len(prompt) :]]
            drafter = OracleTreeDrafter(expected, VOCAB, seed=seed, size=20, depth=7)
            assert specdec.run(model, prompt, drafter, max_new_tokens=40, budget="full",
                               engine=engine).tokens == expected
            assert generator.generate(prompt, max_new_tokens=40).tokens == expected
            IDENTITY_COUNTS[f"llama/oracle-tree/{engine}"] += 1
    finally:
        model.to("cpu")


@cuda
@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_default_model_on_cuda_graphs_matches_generate(
    dtype: str, spec_bench_prompts: dict[str, list[list[int]]]
) -> None:
    """The GPU path on the real model: identical to ``generate``, or first different on a near-tie (reported)."""
    from specdec.testing import compare_outputs

    model, tokenizer = specdec.load_model(device="cuda", dtype=dtype)
    report = []
    for drafter in ("none", "sam+recycling"):
        generator = specdec.Generator(model, tokenizer, drafter=drafter, engine="graphs")
        for category, prompts in sorted(spec_bench_prompts.items()):
            prompt = prompts[1]
            ids = torch.tensor([prompt], device="cuda")
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=64, do_sample=False)
            expected = [int(t) for t in out[0, len(prompt) :]]
            result = generator.generate(prompt, max_new_tokens=64)
            comparison = compare_outputs(model, prompt, result.tokens, expected)
            report.append(f"{drafter}/{category}: {comparison.describe()}")
            assert comparison.acceptable, f"{dtype} {drafter} on {category}: {comparison.describe()}"
            IDENTITY_COUNTS[f"smollm2-cuda-{dtype}/{drafter}" + ("" if comparison.identical else " (near-tie)")] += 1
    print(f"\n{dtype} static cache vs generate: " + "; ".join(report))


def test_warm_up_makes_every_bucket_and_the_capacity_a_request_needs() -> None:
    model = tiny_model("llama")
    generator = specdec.Generator(model, drafter="pld", engine="buckets", budget="full")
    verifier = generator.verifier
    assert isinstance(verifier.forward, BucketForward)
    prompt = [5, 6, 7, 8] * 30  # + 60 new tokens: within the tiny model's 256 positions
    # A live sequence, mid-way, survives a warm-up: its next verification is what it would have been.
    state, pending, _ = verifier.prefill(prompt[:50], reserve=20)
    generator.warm_up(max_tokens=200)
    assert set(verifier.forward._runners) == set(verifier.buckets)
    assert verifier.forward.cache.capacity >= 200 + verifier.forward.largest_bucket
    capacity, generation = verifier.forward.cache.capacity, verifier.forward.cache.generation
    verification = verifier.verify(state, DraftTree.chain(pending, [prompt[50]]))
    fresh = make_verifier(model, engine="hf")
    fresh_state, fresh_pending, _ = fresh.prefill(prompt[:50])
    expected = fresh.verify(fresh_state, DraftTree.chain(fresh_pending, [prompt[50]]))
    assert verification.accepted_tokens == expected.accepted_tokens
    # A request within the warmed length neither regrows the cache nor recompiles.
    assert generator.generate(prompt, max_new_tokens=60).tokens == hf_greedy(model, prompt, 60)
    assert (verifier.forward.cache.capacity, verifier.forward.cache.generation) == (capacity, generation)
    with pytest.raises(SpecDecError, match="positive token count"):
        verifier.warm_up(0)
    assert specdec.Generator(model, drafter="pld", engine="hf").warm_up(64) >= 0.0  # nothing to do there


def test_former_command_line_flags_map_to_the_new_ones(capsys: pytest.CaptureFixture[str]) -> None:
    """``--cache``/``--backend`` are still parsed (hidden): ``--cache`` goes to the Generator's ``cache=`` (which
    warns, naming the engine), the bench's ``--backend`` says on stderr that it is ``--tree-ops`` now."""
    import argparse

    from specdec.commands.arguments import FormerFlag, add_engine_arguments, engine_options

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert engine_options(parser.parse_args([])) == {"engine": "auto", "tree_ops": "auto", "cache": None,
                                                     "backend": None}  # fmt: skip
    assert engine_options(parser.parse_args(["--cache", "native"]))["cache"] == "native"
    assert "--cache" not in parser.format_help() and "--engine" in parser.format_help()
    bench = argparse.ArgumentParser()
    bench.add_argument("--tree-ops", default="auto")
    bench.add_argument("--backend", dest="tree_ops", action=FormerFlag)
    assert bench.parse_args(["--backend", "torch"]).tree_ops == "torch"
    assert "--backend is deprecated: use --tree-ops" in capsys.readouterr().err
