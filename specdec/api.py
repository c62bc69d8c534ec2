"""The public face: :func:`run`, :func:`run_batch`, :func:`generate` and :class:`Generator`.

``run`` is the one-call entry point (model, prompt, drafter); ``run_batch`` the same for many
prompts decoded side by side (:mod:`specdec.batching`); ``Generator`` keeps a model, its
tokenizer, a verifier and a drafter kind for many prompts (one at a time, :meth:`Generator.generate`,
or batched, :meth:`Generator.generate_batch` and :meth:`Generator.iter_batch`); ``generate`` is
the token-in/token-out call with no tokenizer involved.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from typing_extensions import Unpack

from specdec.backends import former_spellings, make_verifier
from specdec.backends.verifier import ModelVerifier
from specdec.batch_rows import DEFAULT_BATCH_SIZE, BatchVerifiers, batch_requests
from specdec.batching import batch_places, check_memory, decode_batch
from specdec.budget import calibration_cache
from specdec.budget.batch_planner import BatchPlanner
from specdec.budget.cost_model import VerifyCostModel
from specdec.budget.machine_load import FOLLOWER
from specdec.budget.memory import PlannerMemory
from specdec.budget.planner import Budget
from specdec.budget.planner_stats import enabled as planner_stats_enabled
from specdec.coercion import Prompt, prompt_ids, resolve_store, text_decoder
from specdec.decoding import DecodingConfig, DecodingOptions
from specdec.drafters.source import DrafterSource, drafter_context, finish
from specdec.engine import BatchRequest, decode
from specdec.model_cache import ModelSpec, resolve_model
from specdec.model_memory import available_memory
from specdec.options import RunOptions, split_options
from specdec.turns import Turns
from specdec.types import Drafter, DrafterFactory, GenerationResult, Verifier


class Generator:
    """A target model with its tokenizer, verifier and drafter kind, for many prompts.

    ``drafter`` is a registered name (a fresh drafter per prompt), a factory, or a
    :class:`~specdec.types.Drafter` object, which is reused across prompts with whatever
    state it learns (Token Recycling's matrix).

    ``budget`` is the default draft budget of :meth:`generate` (docs/usage.md). What the
    budget planners learn (acceptance per drafter source and feature, the measured
    throughput, the refined cost models) lives in ``planner_memory``
    (:class:`~specdec.budget.memory.PlannerMemory`) and carries over from one prompt to the next; it is also saved
    per model, tokenizer, drafter and device after every generation and loaded by the next
    ``Generator`` or :func:`run` of that identity, in any process
    (:mod:`specdec.budget.planner_stats`). Token Recycling's matrix, what named ``recycling``
    drafters (and composites with it) draft from, is shared by every generator of the model
    in the process and saved across processes the same way
    (:mod:`specdec.drafters.recycling_state`). ``planner_cache=False`` or
    ``SPECDEC_PLANNER_CACHE=0`` turns both off (each generation then starts from nothing).

    ``store``: what earlier generations produced, for ``sam`` to draft from
    (:class:`~specdec.datastores.shared_store.SharedStore`): True (default) keeps one for this
    generator's sequences, False none, an int sizes it (tokens), a ``SharedStore`` object is
    used as given (share one across generators and :func:`run` calls).

    **Threads**: a ``Generator`` runs one generation at a time. Calls from several threads
    (:meth:`generate`, :meth:`warm_up`, :meth:`cost_model`) take turns on a lock, each whole, so
    they are safe and give the outputs they give alone; they do not run in parallel (its one
    verifier, static cache and planner statistics serve one sequence at a time). For parallel
    generations make one ``Generator`` per thread (they may share the model object, which none
    of them changes, and a :class:`~specdec.datastores.shared_store.SharedStore`). Calling
    :meth:`generate` again from inside its own ``on_tokens`` callback is refused with a
    :class:`~specdec.errors.SpecDecError` (it would wait for itself).
    """

    def __init__(
        self,
        model: ModelSpec = "default",
        tokenizer: Any = None,
        *,
        drafter: str | Drafter | DrafterFactory = "pld",
        drafter_options: Mapping[str, Any] | None = None,
        engine: str = "auto",
        datastore: str | os.PathLike[str] | None = None,
        budget: str | int = "auto",
        store: Any = True,
        device: Any = None,
        dtype: Any = None,
        planner_cache: bool | None = None,
        tree_ops: str = "auto",
        backend: str | None = None,
        cache: str | None = None,
    ) -> None:
        self._turns = Turns()  # one generation at a time (class docstring: threads)
        self.model, self.tokenizer = resolve_model(model, tokenizer, device, dtype, engine)
        engine, tree_ops = former_spellings(self.model, engine, tree_ops, cache, backend)
        self.verifier: ModelVerifier = make_verifier(self.model, engine, tree_ops=tree_ops)
        calibration_cache.use_cached_kernels(self.verifier)  # nothing measured here
        self.budget = Budget.parse(budget)
        self.planner_memory = PlannerMemory()  # what the budget planners learn, kept across generations
        self.context = drafter_context(  # what the drafters learn is shared under the planner cache's switch
            self.model, self.tokenizer, self.verifier.vocab_size, self.verifier.weights_fingerprint(),
            store=resolve_store(store), acceptance=self.planner_memory.acceptance,
            learned=planner_stats_enabled(planner_cache),
        )  # fmt: skip
        self._decode_text = text_decoder(self.tokenizer)
        self._drafters = DrafterSource(drafter, drafter_options, datastore, self.context)  # a bad name fails here
        self._rows = BatchVerifiers(self.verifier)  # the verifiers of batches, by places
        self.planner_memory.open_stats(planner_cache, self.verifier, self.tokenizer, drafter, self._drafters.options)

    def close(self) -> None:
        """Done with this generator: its verifier's device state (a static cache with its captured CUDA
        graphs) goes to the model's next ``Generator`` or :func:`run`, which then captures nothing.
        Later calls of this generator raise :class:`~specdec.errors.SpecDecError`. Idempotent; also
        ``with Generator(...) as generator:``. :func:`run` and :func:`run_batch` close theirs; a
        generator that is garbage-collected gives its state back too."""
        with self._turns.closing():
            self.verifier.close()
            self._rows.close()

    def __enter__(self) -> Generator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def warm_up(self, max_tokens: int = 2048) -> float:
        """Pay the first-use costs now, not in the first :meth:`generate`; returns the seconds spent.

        On a fixed-shape engine (``"graphs"``, the default on CUDA; ``"compiled"``) every tree-size bucket's
        forward is compiled (inductor) or captured (CUDA graphs) for sequences of up to
        ``max_tokens`` tokens (prompt + new tokens); with ``budget="auto"`` the verification
        cost model is loaded (the cached table, or a prior: nothing is timed). A server calls this once
        before taking requests. Nothing is generated and no sequence is disturbed.
        """
        with self._turns.turn("warm_up"):
            started = time.perf_counter()
            if self.budget.mode == "auto":  # first: a measured table picks the kernels the buckets are compiled with
                self.planner_memory.load_cost(self.verifier)
            self.verifier.warm_up(max_tokens)
            return time.perf_counter() - started

    def cost_model(self) -> tuple[VerifyCostModel, float]:
        """The verifier's cost model and the seconds spent making its table (0.0: cached), its kernels in force.

        Loaded from this process's models or the calibration cache, else a prior that times no
        verification (:func:`specdec.budget.calibration_cache.cost_model`); where the table was
        measured (``specdec calibrate``) the verifier then runs the kernels it chose
        (:meth:`~specdec.types.TunableVerifier.use_kernels`). A
        generation calls it at its first draft, under any budget.
        """
        with self._turns.turn("cost_model"):
            return self.planner_memory.load_cost(self.verifier)

    def new_drafter(self) -> Drafter:
        """The drafter for the next sequence: fresh from the factory, or the user's object as is."""
        return self._drafters.create()

    def decoding_config(self, **options: Unpack[DecodingOptions]) -> DecodingConfig:
        """The :class:`~specdec.decoding.DecodingConfig` of ``options`` (docs/usage.md) for this model and tokenizer.

        Every option is checked here (a bad one raises naming it, an ``eos_token_id`` past the
        vocabulary too); the model's end-of-sequence ids, its generation config and this
        generator's default ``budget`` fill in what ``options`` leave out.
        """
        return DecodingConfig.build(
            options, generation_config=getattr(self.model, "generation_config", None),
            eos_token_ids=self.context.eos_token_ids, decode_text=self._decode_text, budget=self.budget,
            vocab_size=self.verifier.vocab_size,
        )  # fmt: skip

    def generate(
        self,
        prompt: Prompt,
        *,
        on_tokens: Callable[[list[int]], None] | None = None,
        **options: Unpack[DecodingOptions],
    ) -> GenerationResult:
        """Generate a continuation of ``prompt``; docs/usage.md describes the options.

        One generation at a time: a call from another thread waits for the running one to end
        (class docstring: threads).
        """
        config = self.decoding_config(**options)
        ids = prompt_ids(prompt, self.tokenizer, config.chat_template)
        with self._turns.turn("generate"):
            result = self._decode_one(ids, config, on_tokens)
            self._save_learned(result.stats.steps > 0)
        return result

    def _decode_one(
        self, ids: list[int], config: DecodingConfig, on_tokens: Callable[[list[int]], None] | None = None
    ) -> GenerationResult:
        """One sequence through the engine's loop with this generator's planner, drafter and text."""
        planner = self.planner_memory.planner(self.verifier, config.budget)
        drafter = self.new_drafter()
        with FOLLOWER.following(self.verifier.description.device.type == "cpu"):  # the threads the load leaves
            result = decode(self.verifier, drafter, ids, config, planner=planner, on_tokens=on_tokens)
        return self._done(drafter, result)

    def _done(self, drafter: Drafter, result: GenerationResult) -> GenerationResult:
        """A sequence ended: its drafter finishes (e.g. sam adds it to its store), its result gets its text."""
        finish(drafter)
        if self._decode_text is not None:
            result.text = self._decode_text(result.tokens)
        return result

    def _save_learned(self, stepped: bool) -> None:
        """What generations taught (planner statistics, Token Recycling's matrix) goes to the planner cache."""
        if stepped:
            self.planner_memory.save()
        if self.context.recycling is not None:
            self.context.recycling.save()

    # -- many prompts at once ------------------------------------------------------------------
    def generate_batch(
        self,
        prompts: Sequence[Prompt],
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        seeds: Sequence[int] | None = None,
        **options: Unpack[DecodingOptions],
    ) -> list[GenerationResult]:
        """A continuation of every prompt, decoded ``batch_size`` at a time; results in prompt order.

        Each result equals what :meth:`generate` gives that prompt alone (with its seed, when
        sampling) and carries its own stats; :meth:`iter_batch` describes the batch and the options.
        """
        results = dict(self.iter_batch(prompts, batch_size=batch_size, seeds=seeds, **options))
        assert sorted(results) == list(range(len(prompts))), "a batch row produced no result"
        return [results[index] for index in range(len(prompts))]

    def iter_batch(
        self,
        prompts: Sequence[Prompt],
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        seeds: Sequence[int] | None = None,
        **options: Unpack[DecodingOptions],
    ) -> Iterator[tuple[int, GenerationResult]]:
        """Yield ``(index, result)`` for every prompt as its row completes (completion order).

        Continuous batching (:mod:`specdec.batching`): up to ``batch_size`` prompts are decoded
        side by side, one verification forward per step for all of them on ``engine="specdec"``
        (the CPU's default) and on the fixed-shape engines (CUDA's default: the rows share one cache,
        :mod:`specdec.backends.buckets.rows`); Hugging Face's forward (``engine="hf"``)
        verifies the rows one after another. A finished row's place goes to the next
        prompt at once. Each row has its own drafter (from this generator's drafter name or
        factory; shared datastores are shared, and ``sam``'s store is fed by every row that
        finishes), its own stop rules and its own seed: with ``seed=S`` (or a seed drawn when
        sampling without one) row ``i`` samples with seed ``S + i``; ``seeds`` gives every row
        its own (each result's ``seed`` repeats it alone). ``options`` are :meth:`generate`'s
        (``on_tokens`` excepted); ``budget="auto"`` plans the whole batch
        (:mod:`specdec.budget.batch_planner`). One place (``batch_size=1``, or a static cache)
        is :meth:`generate`'s own loop and planner, one prompt after another.

        Everything is checked before the first prompt runs: every prompt (an error names its
        index), the options, and the memory the batch's KV caches need
        (:func:`specdec.batching.check_memory`: too large a batch is refused, naming the batch
        size that fits).
        """
        config = self.decoding_config(**options)
        requests = batch_requests(prompts, batch_size, seeds, options, config, self.tokenizer, self.verifier)
        verifier = self._rows.get(batch_size)
        places = batch_places(verifier, batch_size)
        self._drafters.check_rows(places)
        check_memory(verifier, requests, batch_size, available_memory(verifier.description.device))
        planner = self.planner_memory.batch_planner(self.verifier, config.budget)
        return self._turns.held("iter_batch", self._batch(verifier, requests, places, planner))

    def _batch(
        self, verifier: Verifier[Any], requests: list[BatchRequest], batch_size: int, planner: BatchPlanner
    ) -> Iterator[tuple[int, GenerationResult]]:
        stepped = False
        try:
            if batch_size == 1:  # one place: the single-sequence path itself, one row after another
                for request in requests:
                    result = self._decode_one(request.prompt, request.config)
                    stepped = stepped or result.stats.steps > 0
                    yield request.index, result
                return
            for finished in decode_batch(verifier, requests, self.new_drafter, batch_size=batch_size, planner=planner):
                result = self._done(finished.drafter, finished.result)
                stepped = stepped or result.stats.steps > 0
                yield finished.index, result
        finally:
            self._save_learned(stepped)


def run(
    model: ModelSpec,
    prompt: Prompt,
    drafter: str | Drafter | DrafterFactory = "pld",
    **options: Unpack[RunOptions],
) -> GenerationResult:
    """Generate from ``prompt`` with speculative decoding; the output equals plain decoding's.

    ``model``: a Hugging Face causal LM object, a local checkpoint path or ``"default"``
    (SmolLM2-135M-Instruct); ``prompt``: text (the chat template applied when the tokenizer has
    one), chat messages or token ids; ``drafter``: a registered name
    (``specdec.available_drafters()``), a factory or a drafter object. ``options``: the decoding
    options (``max_new_tokens``, ``stop``, ``budget``, sampling, ...), the :class:`Generator`'s
    (``engine``: what runs the model's forward; ``device``, ``dtype``, ``store``,
    ``planner_cache``, ...), ``tokenizer`` and ``on_tokens``: each is described in docs/usage.md.
    Returns a :class:`~specdec.types.GenerationResult` (``tokens``, ``text``, ``stats``).
    """
    construction, decoding = split_options(options, "run")
    with Generator(model, options.get("tokenizer"), drafter=drafter, **construction) as generator:
        return generator.generate(prompt, on_tokens=options.get("on_tokens"), **decoding)


def run_batch(
    model: ModelSpec,
    prompts: Sequence[Prompt],
    drafter: str | DrafterFactory = "pld",
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    seeds: Sequence[int] | None = None,
    **options: Unpack[RunOptions],
) -> list[GenerationResult]:
    """:func:`run` for many prompts, decoded ``batch_size`` at a time: one result per prompt, in prompt order.

    Every row's tokens are those :func:`run` gives its prompt alone; each result has its own
    stats (and its own ``seed`` when sampling: with ``seed=S`` row ``i`` samples with ``S + i``,
    or give ``seeds``, one per prompt). The options are :func:`run`'s but ``on_tokens``; see
    :meth:`Generator.iter_batch` for the batching itself.
    """
    construction, decoding = split_options(options, "run_batch", streams=False)
    with Generator(model, options.get("tokenizer"), drafter=drafter, **construction) as generator:
        return generator.generate_batch(prompts, batch_size=batch_size, seeds=seeds, **decoding)


def generate(
    model: ModelSpec,
    input_ids: Sequence[int] | Any,
    drafter: str | Drafter | DrafterFactory = "pld",
    **options: Unpack[RunOptions],
) -> list[int]:
    """Token ids in, new token ids out: :func:`run` without the text; the same options."""
    split_options(options, "generate")
    return run(model, input_ids, drafter, **options).tokens
