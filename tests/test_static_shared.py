"""Compiled forwards shared per model (specdec.backends.buckets.shared) and the self-check at first use (issue 30).

Compiles are counted, not timed: ``shared.COMPILED`` (compiled functions specdec
built) and dynamo's own count of graphs it compiled. The self-check tests replace the
compiler (``bucket_forward.compile_forward``) by a wrapper of the eager forward that corrupts, jitters
or refuses: what is under test is what the verifier does with a forward's output, and a real
compilation per case would cost tens of seconds. The sharing test compiles for real (one
bucket, twice: once before and once after an in-place weight update).
"""

from __future__ import annotations

import copy
import gc
import random
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from conftest import IDENTITY_COUNTS
from oracle_drafter import OracleTreeDrafter
from test_lossless import hf_greedy, random_prompt
from tiny_models import VOCAB, tiny_model
from torch._dynamo.utils import counters

import specdec
from specdec.backends.buckets import device_set, shared, sizes
from specdec.backends.buckets import forward as bucket_forward
from specdec.backends.buckets import runner as bucket_runner
from specdec.backends.buckets.forward import BucketForward, bucket_verifier
from specdec.backends.slot_cache import MIN_CAPACITY
from specdec.decoding import DecodingConfig, StopRules
from specdec.engine import decode
from specdec.types import DraftTree, KernelChoice

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


def private_model(arch: str = "llama", seed: int = 0) -> Any:
    """A tiny fp64 model of its own (the cached tiny models must stay as they are, and alive)."""
    return copy.deepcopy(tiny_model(arch, seed=seed))


def compiled_count() -> tuple[int, int]:
    """(compiled functions specdec built, graphs dynamo compiled) in this process so far."""
    return shared.COMPILED, counters["stats"]["unique_graphs"]


@pytest.fixture
def record() -> Iterator[list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


def static_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if str(w.message).startswith("engine='")]


# -- sharing ------------------------------------------------------------------------------


def test_a_second_run_compiles_nothing_and_the_forwards_die_with_the_model() -> None:
    model = private_model()
    rng = random.Random(30)
    prompts = [random_prompt(rng)[:12] for _ in range(3)]
    options: dict[str, Any] = {"max_new_tokens": 10, "engine": "compiled", "budget": "full"}
    # drafter "none": only the one-node bucket runs, so one compilation is the whole cost
    start = compiled_count()
    assert specdec.run(model, prompts[0], "none", **options).tokens == hf_greedy(model, prompts[0], 10)
    first = compiled_count()
    assert first[0] == start[0] + 1 and first[1] > start[1]
    with torch._dynamo.config.patch(error_on_recompile=True):
        assert specdec.run(model, prompts[1], "none", **options).tokens == hf_greedy(model, prompts[1], 10)
        generator = specdec.Generator(model, drafter="none", engine="compiled", budget="full")
        assert generator.generate(prompts[2], max_new_tokens=10).tokens == hf_greedy(model, prompts[2], 10)
    assert compiled_count() == first  # neither specdec nor dynamo compiled anything for the later calls
    assert isinstance(generator.verifier.forward, BucketForward) and generator.verifier.forward._runners[1].checked
    IDENTITY_COUNTS["llama/none/static-inductor (shared forwards)"] += 3

    # Weights updated in place: frozen constants are stale, so the next call compiles afresh.
    with torch.no_grad():
        model.lm_head.weight.mul_(-1.0)
    after_update = specdec.run(model, prompts[0], "none", **options).tokens
    assert after_update == hf_greedy(model, prompts[0], 10)
    assert compiled_count()[0] == first[0] + 1
    (store,) = shared.stores_of(model).values()
    assert store.signature == shared.weights_signature(model) and len(store.forwards) == 1

    # Held weakly: dropping the model (and the generator that uses it) frees its compiled forwards.
    alive = weakref.ref(model)
    stores = len(shared._STORES)
    del model, generator, store
    gc.collect()
    # its entry went with it (other tests' models may be collected by the same gc.collect(): at most, not exactly)
    assert alive() is None and len(shared._STORES) <= stores - 1


def test_verifiers_of_other_settings_do_not_share() -> None:
    model = private_model(seed=2)
    eager = bucket_verifier(model, engine="buckets", buckets=(1, 4))
    compiled = bucket_verifier(model, engine="compiled", buckets=(1, 4))
    store = eager.forward.shared_store()
    assert store is not None and store is compiled.forward.shared_store()  # same settings
    compiled.use_kernels(KernelChoice.uniform("default"))  # what a calibration sets: the same forwards
    assert compiled.forward.shared_store() is eager.forward.shared_store()
    compiled.forward.weight_prepack = True  # frozen weights prepacked into oneDNN layouts: another compiled program
    assert compiled.forward.shared_store() is not eager.forward.shared_store()
    compiled.forward.weight_prepack = False
    assert compiled.forward.shared_store() is eager.forward.shared_store()
    compiled.forward.freezing = False  # weights as inputs: another compiled program
    assert compiled.forward.shared_store() is not eager.forward.shared_store()
    other = private_model(seed=2)
    assert bucket_verifier(other, engine="compiled").forward.shared_store() is not store  # another model object
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    assert bucket_verifier(model, engine="compiled").forward.shared_store() is not store  # other weights


def test_one_capacity_is_kept_and_later_verifiers_reserve_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A forward is specialised to its cache's capacity: a short request after a long one runs on the
    long one's capacity (idle slots, no compilation), and forwards of a smaller capacity are dropped."""
    compile_forward, built = fake_compiler(lambda logits: logits)
    monkeypatch.setattr(bucket_forward, "compile_forward", compile_forward)
    model = private_model("llama", seed=6)
    short, long = [5, 6, 7, 8] * 3, [t % VOCAB for t in range(7, 157)]

    def verify(prompt: list[int], new_tokens: int) -> Any:
        verifier = bucket_verifier(model, engine="compiled", buckets=(1, 128))  # the cache holds a 128-node tree more
        result = decode(verifier, specdec.make_factory("none").create(), prompt, DecodingConfig(StopRules(new_tokens)))
        assert result.tokens == hf_greedy(model, prompt, new_tokens)
        return verifier

    assert verify(short, 10).forward.cache.capacity == 256 and len(built) == 1
    assert verify(long, 100).forward.cache.capacity == 512 and len(built) == 2
    (store,) = shared.stores_of(model).values()
    assert list(store.forwards) == [("inductor", 1, 512)]  # the 256-slot forward is gone
    assert verify(short, 10).forward.cache.capacity == 512 and len(built) == 2
    eager = bucket_verifier(model, engine="buckets").forward
    assert eager.shared_store().reserved("eager") == 0  # eager compiles nothing
    assert verify(short, 10).forward.cache.capacity == 512


# -- device states lent from run to run (captured graphs) ----------------------------------


@pytest.fixture
def pooled_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pool the eager mode's device state as the CUDA-graph modes' is pooled: the lending logic is the
    same for every mode (sizes.POOLED_MODES only says which pay for it), and runs here without a GPU."""
    monkeypatch.setattr(device_set, "POOLED_MODES", ("eager",))


@pytest.mark.slow  # ~13 s on a 2-core CPU
def test_a_closed_generators_device_state_serves_the_next_one_and_only_one(pooled_eager: None) -> None:
    model = private_model(seed=7)
    rng = random.Random(7)
    prompts = [random_prompt(rng)[:16] for _ in range(4)]
    truths = [hf_greedy(model, p, 20) for p in prompts]
    options: dict[str, Any] = {"drafter": "pld", "engine": "buckets", "budget": "full"}

    first = specdec.Generator(model, **options)
    assert first.generate(prompts[0], max_new_tokens=20).tokens == truths[0]
    held = first.verifier.forward.held
    assert isinstance(first.verifier.forward, BucketForward) and held.runners and shared.idle_count(model) == 0
    first.close()
    first.close()  # idempotent
    assert shared.idle_count(model) == 1
    with pytest.raises(specdec.SpecDecError, match="was closed"):
        first.generate(prompts[0], max_new_tokens=4)

    with specdec.Generator(model, **options) as second:  # takes the state: same cache, same runners
        assert second.verifier.forward.held is held and shared.idle_count(model) == 0
        assert all(runner.verifier is second.verifier.forward for runner in held.runners.values())
        third = specdec.Generator(model, **options)  # a live verifier's state is its own
        assert third.verifier.forward.held is not held
        assert second.generate(prompts[1], max_new_tokens=20).tokens == truths[1]
        assert third.generate(prompts[2], max_new_tokens=20).tokens == truths[2]
    assert shared.idle_count(model) == 1
    del third  # not closed: collected, it gives its state back too, but one waits per setting at most
    gc.collect()
    assert shared.idle_count(model) == shared.IDLE_PER_SETTING == 1
    # run() closes its generator: its state waits for the next call, which reuses it
    assert specdec.run(model, prompts[3], **options, max_new_tokens=20).tokens == truths[3]
    assert shared.idle_count(model) == 1
    with specdec.Generator(model, **options) as fourth:
        assert fourth.verifier.forward.held is held
    IDENTITY_COUNTS["llama/pld/static-eager (lent device state)"] += 4


def test_a_lent_state_is_rebuilt_for_new_weights_and_dies_with_the_model(pooled_eager: None) -> None:
    model = private_model(seed=8)
    prompt = random_prompt(random.Random(8))[:16]
    options: dict[str, Any] = {"drafter": "pld", "engine": "buckets", "budget": "full"}
    with specdec.Generator(model, **options) as generator:
        generator.generate(prompt, max_new_tokens=12)
        held = generator.verifier.forward.held
    assert held.runners
    with torch.no_grad():
        next(model.parameters()).mul_(1.5)  # in place: a captured graph would still read these addresses
    with specdec.Generator(model, **options) as generator:
        assert generator.verifier.forward.held is held and not held.runners  # rebuilt at first use
        assert generator.generate(prompt, max_new_tokens=12).tokens == hf_greedy(model, prompt, 12)
    assert shared.idle_count(model) == 1
    alive = weakref.ref(model)
    del model, generator
    gc.collect()
    assert alive() is None  # the pool holds the model weakly


def test_a_regrown_cache_drops_its_graphs_memory_pool_with_them() -> None:
    """Graphs captured for a smaller cache are dropped when it grows, and their pool handle with them: a
    capture into a pool whose graphs are all gone fails in the CUDA allocator (seen on an H200)."""
    model = private_model(seed=10)
    verifier = bucket_verifier(model, engine="buckets")
    prompt = random_prompt(random.Random(10))[:8]
    state, pending, _ = verifier.prefill(prompt, reserve=4)
    verifier.verify(state, DraftTree.chain(pending, [1, 2]))
    assert verifier.forward.held.runners
    verifier.forward.held.graph_pool = marker = object()  # what a capture leaves (graph_pool())
    verifier.prefill(prompt, reserve=4)  # no growth: the graphs and their pool stay
    assert verifier.forward.held.graph_pool is marker and verifier.forward.held.runners
    verifier.prefill(prompt, reserve=MIN_CAPACITY)  # grows: every graph and the pool go
    assert verifier.forward.cache.capacity > MIN_CAPACITY
    assert verifier.forward.held.graph_pool is None and not verifier.forward.held.runners


def test_modes_that_rebuild_cheaply_keep_nothing_back() -> None:
    model = private_model(seed=9)
    assert "eager" not in sizes.POOLED_MODES and "cudagraphs" in sizes.POOLED_MODES
    prompt = random_prompt(random.Random(9))[:16]
    result = specdec.run(model, prompt, "pld", max_new_tokens=8, engine="buckets")
    assert result.tokens == hf_greedy(model, prompt, 8)
    assert shared.idle_count(model) == 0


# -- the self-check ------------------------------------------------------------------------


def fake_compiler(change: Callable[[torch.Tensor], torch.Tensor]) -> tuple[Callable[..., Any], list[int]]:
    """A stand-in for ``bucket_forward.compile_forward``: the eager forward with ``change`` applied to its logits."""
    built: list[int] = []

    def compile_forward(function: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        built.append(1)
        return lambda *args: change(function(*args))

    return compile_forward, built


def oracle_run(model: Any, seed: int, engine: str = "compiled") -> tuple[list[int], list[int], Any]:
    """(tokens, plain greedy's tokens, generator) for an oracle tree drafter (many buckets) on ``engine``."""
    prompt = random_prompt(random.Random(seed))
    truth = hf_greedy(model, prompt, 40)
    generator = specdec.Generator(model, drafter="none", engine=engine, budget="full")
    drafter = OracleTreeDrafter(truth, VOCAB, seed=seed, size=12, depth=5)
    result = decode(generator.verifier, drafter, prompt, DecodingConfig(StopRules(40)))
    fallback = generator.verifier.forward.fallback_reason is not None  # type: ignore[attr-defined]
    assert result.stats.engine == engine + (" (fell back to eager forwards)" if fallback else "")
    return result.tokens, truth, generator


def test_a_wrong_compiled_forward_warns_once_and_the_tokens_stay_plain_greedys(
    monkeypatch: pytest.MonkeyPatch, record: list[warnings.WarningMessage]
) -> None:
    compile_forward, built = fake_compiler(lambda logits: torch.roll(logits, 1, dims=-1))  # every argmax moves
    monkeypatch.setattr(bucket_forward, "compile_forward", compile_forward)
    model = private_model("qwen2")
    tokens, truth, generator = oracle_run(model, seed=1)
    assert tokens == truth
    (message,) = static_warnings(record)
    assert "engine='compiled': its forwards disagree with the eager forward" in message and "bucket" in message
    assert generator.verifier.forward.fallback_reason is not None  # the result said so (oracle_run)
    assert all(runner.mode == "eager" for runner in generator.verifier.forward._runners.values())
    # The model's next verifier does not compile again: it runs eagerly, with its own warning.
    compiled = len(built)
    tokens, truth, _ = oracle_run(model, seed=2)
    assert tokens == truth and len(built) == compiled
    assert len(static_warnings(record)) == 2 and "failed for this model earlier" in static_warnings(record)[1]
    IDENTITY_COUNTS["qwen2/oracle-tree/static-inductor (wrong forward, fallback)"] += 2


def test_a_forward_that_agrees_within_rounding_passes(
    monkeypatch: pytest.MonkeyPatch, record: list[warnings.WarningMessage]
) -> None:
    compile_forward, built = fake_compiler(lambda logits: logits * (1.0 + 1e-9))  # far below fp64's tolerance
    monkeypatch.setattr(bucket_forward, "compile_forward", compile_forward)
    tokens, truth, generator = oracle_run(private_model("llama", seed=3), seed=3)
    assert tokens == truth and not static_warnings(record)
    runners = generator.verifier.forward._runners.values()
    assert len(runners) > 1 and all(r.mode == "inductor" and r.checked for r in runners) and len(built) == len(runners)


def test_a_forward_that_fails_to_compile_falls_back_to_eager(
    monkeypatch: pytest.MonkeyPatch, record: list[warnings.WarningMessage]
) -> None:
    def refuse(logits: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("the compiler gave up")

    compile_forward, _ = fake_compiler(refuse)
    monkeypatch.setattr(bucket_forward, "compile_forward", compile_forward)
    tokens, truth, _ = oracle_run(private_model("llama", seed=4), seed=4)
    assert tokens == truth
    messages = static_warnings(record)
    # Where an earlier compile in this process filled the compiled-code folder, the failure is first
    # blamed on that folder: one warning that it was emptied and the bucket compiled again (which fails
    # again here). Then exactly one warning of the fallback itself.
    retried = [m for m in messages if "removed it, compiling again" in m]
    (message,) = [m for m in messages if m not in retried]
    assert len(retried) <= 1 and all("the compiler gave up" in m for m in retried)
    assert "engine='compiled': its forwards are not possible" in message and "the compiler gave up" in message


@cuda
def test_a_wrong_cuda_graph_warns_and_the_tokens_stay_plain_greedys(
    monkeypatch: pytest.MonkeyPatch, record: list[warnings.WarningMessage]
) -> None:
    """The CUDA-graph path (the GPU default): a corrupted replay is caught at the bucket's first use."""
    run = bucket_runner.BucketRunner.run

    def corrupted(self: bucket_runner.BucketRunner) -> torch.Tensor:
        logits = run(self)
        return torch.roll(logits, 1, dims=-1) if self.mode == "cudagraphs" else logits

    monkeypatch.setattr(bucket_runner.BucketRunner, "run", corrupted)
    model = private_model("llama", seed=5).to("cuda")
    prompt = random_prompt(random.Random(5))
    truth = hf_greedy(model, prompt, 30)
    drafter = OracleTreeDrafter(truth, VOCAB, seed=5, size=12, depth=5)
    assert specdec.run(model, prompt, drafter, max_new_tokens=30, budget="full", engine="graphs").tokens == truth
    (message,) = static_warnings(record)
    assert "engine='graphs': its forwards disagree" in message


@cuda
def test_a_second_run_on_cuda_replays_the_graphs_the_first_captured() -> None:
    """The GPU default: run() gives its captured graphs back, the next run() captures nothing."""
    model = private_model("llama", seed=6).to("cuda")
    rng = random.Random(6)
    captures: list[tuple[int, int, int]] = []  # (run, bucket, width tier) of every capture
    capture = bucket_runner.BucketRunner._capture
    index = 0

    def counted(self: bucket_runner.BucketRunner, forward: Callable[[], torch.Tensor]) -> tuple[Any, torch.Tensor]:
        captures.append((index, self.size, self.verifier.cache.width))  # a graph per bucket and width tier
        return capture(self, forward)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bucket_runner.BucketRunner, "_capture", counted)
        for index in range(3):
            prompt = random_prompt(rng)
            truth = hf_greedy(model, prompt, 30)
            drafter = OracleTreeDrafter(truth, VOCAB, seed=index, size=8, depth=4)
            assert specdec.run(model, prompt, drafter, max_new_tokens=30, budget="full").tokens == truth
    graphs = [entry[1:] for entry in captures]
    assert graphs and len(graphs) == len(set(graphs)), captures  # no graph captured twice
    assert {run for run, _, _ in captures} == {0}, captures  # later runs replayed the first one's graphs
    assert shared.idle_count(model) == 1


@cuda
def test_graphs_are_captured_again_after_the_cache_grows(record: list[warnings.WarningMessage]) -> None:
    """A request longer than the captured cache holds regrows it and captures every bucket again, into a
    fresh pool: no fallback, no warning, plain greedy's tokens."""
    model = private_model("llama", seed=11).to("cuda")
    generator = specdec.Generator(model, drafter="pld", engine="graphs", budget="full")
    rng = random.Random(11)
    for length in (12, 100):  # 100 + 60 new tokens + the largest bucket (128): past the first 256 slots
        prompt = [rng.randrange(VOCAB) for _ in range(length // 4)] * 4
        assert generator.generate(prompt, max_new_tokens=60).tokens == hf_greedy(model, prompt, 60)
    verifier = generator.verifier
    assert isinstance(verifier.forward, BucketForward) and verifier.forward.cache.capacity > MIN_CAPACITY
    assert verifier.forward.fallback_reason is None and not static_warnings(record)
    assert all(runner.mode == "cudagraphs" for runner in verifier.forward.held.runners.values())


# -- the comparison --------------------------------------------------------------------------


def test_disagreement_tolerates_rounding_and_near_ties_only() -> None:
    torch.manual_seed(0)
    eager = torch.randn(4, 50, dtype=torch.float32) * 10
    assert shared.disagreement(eager.clone(), eager) is None
    assert shared.disagreement(eager + 1e-4, eager) is None  # another kernel order's rounding
    assert "max |logit difference|" in str(shared.disagreement(eager + 1.0, eager))
    wrong = eager.clone()
    wrong[2, int(eager[2].argmin())] = eager[2].max() + 0.001  # a wrong token wins, its logit far off
    assert str(shared.disagreement(wrong, eager)).startswith("node 2")
    tie = eager.clone()
    top = int(eager[1].argmax())
    second = int(eager[1].topk(2).indices[1])
    tie[1, second] = tie[1, top] = eager[1, top]  # a near-tie: either token is a rounding away
    near = eager.clone()
    near[1, second] = eager[1, top] - 1e-5
    assert shared.disagreement(tie, near) is None
    assert "shape" in str(shared.disagreement(eager[:3], eager))
    assert shared.disagreement(eager.masked_fill(eager > 5, float("nan")), eager) is not None
    half = eager.to(torch.bfloat16)
    assert shared.disagreement(half + 0.25, half) is None  # bf16's tolerance is wider
    assert shared.disagreement(eager.double() + 0.25, eager.double()) is not None  # fp64's is not


def test_compiled_forwards_run_under_the_verifiers_prepacking_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inductor reads ``freezing`` and ``cpp.weight_prepack`` where a compilation starts: every call of a
    compiled forward runs under the verifier's settings (prepacking off by default: a packed copy of the
    weights per bucket tripled the compile's peak memory on the default model)."""
    seen: list[tuple[bool, bool]] = []

    def change(logits: torch.Tensor) -> torch.Tensor:
        seen.append((torch._inductor.config.freezing, torch._inductor.config.cpp.weight_prepack))
        return logits

    compile_forward, _ = fake_compiler(change)
    monkeypatch.setattr(bucket_forward, "compile_forward", compile_forward)
    prompt = [5, 6, 7, 8, 5, 6]
    for prepack in (False, True):
        verifier = bucket_verifier(private_model("llama", seed=9 + prepack), engine="compiled", buckets=(1, 4))
        assert verifier.forward.weight_prepack is False  # the default
        verifier.forward.weight_prepack = prepack
        decode(verifier, specdec.make_factory("none").create(), prompt, DecodingConfig(StopRules(3)))
        assert seen and set(seen) == {(True, prepack)}
        seen.clear()
