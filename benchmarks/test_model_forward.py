"""The product's own speed: the default model's verification forward per kernel path, and whole generations.

- ``test_verify_forward``: one verification of a chain of 1, 8 and 16 nodes after a fixed
  1,024-token context on ``engine="specdec"`` (rewound between calls, as
  :func:`specdec.bench.curves.measure` does), with every op of specdec's CPU kernels forced
  to one kernel path (``avx512``, ``avx512-blocks``, ``avx2``, ``avx2-blocks``, ``avx2-lanes16``, ``portable``: a
  path this CPU lacks is a skip naming what it runs), and with torch's kernels (``default``);
- ``test_generate``: one greedy generation of a fixed prompt, a fixed number of new tokens,
  plain (``drafter="none"``) and speculative (``sam+recycling``, a fixed budget of 16 nodes,
  so no calibration runs); tokens/s and steps in
  ``extra_info``.

Each round is preceded by a read of the model's weights (the bytes a one-token forward must
read, :func:`specdec.bench.curves.weight_read_ms`): ``extra_info["reference_s"]`` is those
reads' median, and the root ``conftest.py`` compares the forward's median over it with the
saved baseline's, so a drift of the machine's memory bandwidth cancels and a slower kernel
path does not. Skipped (with the reason) where the default model is not installed.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

import pytest

from specdec.backends.specdec_engine.cpu_kernels import ISAS as KERNEL_PATHS

CONTEXT = 1024  # committed tokens before every verification
NODES = (1, 8, 16)
ISAS = KERNEL_PATHS[1:]  # every path by name ("auto" is one of them)
ROUNDS = 5
PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring and a test."
NEW_TOKENS = 64
DRAFTERS = ("none", "sam+recycling")
# A fixed draft budget: the default ("auto") calibrates a cost model on first use, minutes on a busy
# machine, and plans by measured times, so steps would move with the load.
BUDGET = 16


def weight_read_s(model: Any) -> float:
    """One read of every weight byte, in seconds (the reference timing of a model benchmark)."""
    from specdec.bench.curves import weight_read_ms

    return weight_read_ms(model, repeats=0) / 1e3


@pytest.fixture(scope="module")
def prefilled(default_model: Any) -> tuple[Any, Any, int]:
    """A ``engine="specdec"`` verifier, its state after a fixed random :data:`CONTEXT`-token prompt, and its pending
    token."""
    from specdec.backends import make_verifier

    verifier = make_verifier(default_model, "specdec")
    rng = random.Random(0)
    prompt = [rng.randrange(verifier.vocab_size) for _ in range(CONTEXT)]
    state, pending, _ = verifier.prefill(prompt, reserve=max(NODES))
    return verifier, state, pending


def kernels_for(verifier: Any, path: str) -> None:
    """Make ``verifier`` run ``path``: torch's kernels (``default``) or specdec's CPU kernels forced to one ISA."""
    from specdec.backends.specdec_engine import cpu_kernels
    from specdec.backends.specdec_engine.forward import CPU_KERNEL, _forced_kernels
    from specdec.types import DEFAULT_KERNEL, KernelChoice

    if path == "default":
        verifier.use_kernels(KernelChoice.uniform(DEFAULT_KERNEL))
        return
    if not verifier.forward.kernels_available:
        pytest.skip("specdec's CPU kernels do not build here or do not serve the default model")
    if path not in cpu_kernels.supported_isas():
        pytest.skip(f"this CPU cannot run the {path} kernel path (it runs {', '.join(cpu_kernels.supported_isas())})")
    verifier.forward.cpu_kernels = _forced_kernels(path)
    verifier.use_kernels(KernelChoice.uniform(CPU_KERNEL))


@pytest.mark.parametrize("nodes", NODES)
@pytest.mark.parametrize("path", [*ISAS, "default"])
def test_verify_forward(benchmark: Any, prefilled: tuple[Any, Any, int], default_model: Any, path: str,
                        nodes: int) -> None:
    """One verification of a ``nodes``-node chain after :data:`CONTEXT` tokens, on kernel path ``path``."""
    from specdec.types import DraftTree

    verifier, state, pending = prefilled
    kernels_for(verifier, path)
    tree = DraftTree.chain(pending, [(pending + 1 + i) % verifier.vocab_size for i in range(nodes - 1)])
    reads: list[float] = []

    def setup() -> None:
        verifier.rewind(state, CONTEXT)
        reads.append(weight_read_s(default_model))

    benchmark.pedantic(verifier.verify, args=(state, tree), setup=setup, rounds=ROUNDS, warmup_rounds=1)
    verifier.rewind(state, CONTEXT)
    benchmark.extra_info.update(path=path, nodes=nodes, context=CONTEXT, reference="weight read",
                                reference_s=statistics.median(reads))  # fmt: skip


@pytest.fixture(scope="module")
def generators(default_model: Any, tokenizer: Any) -> Any:
    """``generator(drafter)``: one :class:`specdec.Generator` per drafter, ``engine="specdec"``, that saves nothing."""
    from specdec import Generator

    made: dict[str, Any] = {}

    def get(drafter: str) -> Any:
        if drafter not in made:
            made[drafter] = Generator(default_model, tokenizer, drafter=drafter, engine="specdec", store=False,
                                      planner_cache=False, budget=BUDGET)  # fmt: skip
        return made[drafter]

    yield get
    for generator in made.values():
        generator.close()


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_generate(benchmark: Any, generators: Any, default_model: Any, drafter: str) -> None:
    """A greedy generation of :data:`NEW_TOKENS` tokens of :data:`PROMPT` with ``drafter``."""
    if benchmark.disabled:
        # The first speculative generation calibrates the verifier's kernel choice and cost model (over
        # 90 s on a busy 2-core machine): too slow for the smoke run; timed runs only.
        pytest.skip("timed runs only (pytest --benchmark): a first generation calibrates for minutes")
    generator = generators(drafter)
    reads: list[float] = []
    results: list[Any] = []

    def setup() -> None:
        reads.append(weight_read_s(default_model))

    def target() -> None:
        started = time.perf_counter()
        result = generator.generate(PROMPT, max_new_tokens=NEW_TOKENS, ignore_eos=True)
        results.append((result, time.perf_counter() - started))

    # One warm-up round: the first generation builds the drafter's state and warms the caches.
    benchmark.pedantic(target, setup=setup, rounds=3, warmup_rounds=1)
    result, _ = results[-1]
    seconds = statistics.median(s for _, s in results[-3:])
    benchmark.extra_info.update(drafter=drafter, new_tokens=result.stats.new_tokens, steps=result.stats.steps,
                                tokens_per_s=round(result.stats.new_tokens / seconds, 2), reference="weight read",
                                reference_s=statistics.median(reads))  # fmt: skip
