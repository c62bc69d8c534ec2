"""The soak: one :class:`~specdec.Generator` over hundreds of prompts, checked on every one.

What a long-running server does to a generator, in one process: many prompts of every kind
(Spec-Bench's six categories, the held-out prompts, prompts that end after a few tokens),
drafters that change from one prompt to the next, greedy and seeded sampling, stop strings,
early end-of-sequence, one :class:`~specdec.datastores.shared_store.SharedStore` with a token
budget collecting every output. After each prompt the soak checks three things:

- **identity**: the output against plain decoding of the same prompt and options
  (``drafter="none"`` through a second generator on the same model and verifier kind, so the
  same kernels): greedy outputs must be token-identical or differ at a near-tie of the
  model's top two and be plain decoding of their own branch after it
  (:func:`specdec.testing.compare_outputs`); sampled outputs must equal plain sampling with
  the same seed token for token (sampling is position-keyed: a speculative step draws the
  same token a plain step does);
- **the store's budget**: its token count never above the budget;
- **memory**: the process's resident set (RSS) after every prompt, read after the C allocator
  hands its free memory back (:func:`release_free_memory`), so a reading is live memory, not
  the allocator's high-water; after the warm-up prompts (every prompt kind and drafter has
  run by then, so kernel workspaces and the recycling matrix have reached their size) the
  largest RSS may exceed the RSS at the end of the warm-up by at most a stated bound (with
  several threads, the floor of the readings: :attr:`SoakReport.rss_growth_mb`).

**Batches and threads**: with ``batch_every=N`` every N-th greedy prompt is decoded by
:meth:`~specdec.Generator.generate_batch` beside the previous prompt (a batch of two, each row
checked against plain decoding of that row); with ``threads=2`` two threads take the prompts in
turn and call the one generator, whose lock serializes its generations, while each thread's
plain reference runs on the same model object beside the other thread's generation.

**One generator, many drafters**: a ``Generator`` takes its drafter at construction, but a
drafter given as a factory object is asked for a fresh drafter per prompt
(:meth:`specdec.Generator.new_drafter`). :class:`RotatingFactory` is such a factory: it holds
one factory per drafter name, made with the generator's own context (its shared store, its
acceptance model), and the soak names the next prompt's drafter before each generation. So
one generator (one verifier, one planner, one store) serves every drafter, as it would serve
a stream of requests.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from specdec.api import Generator
from specdec.bench.plot import pyplot, save_figure
from specdec.datastores.shared_store import SharedStore
from specdec.drafters import DrafterContext, make_factory
from specdec.errors import SpecDecError
from specdec.testing import compare_outputs
from specdec.types import Drafter, DrafterFactory

DRAFTERS = ("sam+recycling", "pld", "sam", "recycling", "none")
NEW_TOKENS = (24, 32, 48)
FLOOR_WINDOW = 10  # readings whose smallest is the floor, with several threads (SoakReport.rss_growth_mb)
STOPS = (("\n\n",), (". ",))
SAMPLING = {"temperature": 0.8, "top_p": 0.95}
# Prompts a chat model answers in a word or two and then ends (early end-of-sequence).
SHORT_PROMPTS = (
    "Reply with one word: what colour is the sky on a clear day?",
    "Answer yes or no only: is water wet?",
    "Give only the number: what is 7 times 8?",
    "Say only 'OK'.",
    "One word only: the opposite of hot?",
    "Answer with a single letter: the first letter of the English alphabet?",
    "Reply with just the name of the capital of France.",
    "Give only the number: how many days are in a week?",
    "Respond with one word: a fruit that is yellow.",
    "Say 'done' and nothing else.",
    "Answer true or false only: the sun is a star.",
    "One word: the animal that says 'moo'.",
)
DEFAULT_WARMUP = 50
# The RSS bound's default (MiB): see docs/benchmarks.md "Soak" for the growth measured against it.
DEFAULT_RSS_GROWTH_MB = 64.0
# The store's default budget: about a third of what ~500 prompts' sam-drafted outputs hold, so a full soak evicts.
DEFAULT_STORE_TOKENS = 1024


@dataclass(frozen=True)
class SoakCase:
    """One prompt of the soak and how it is decoded. ``seed`` None: greedy; ``eos_token_id`` None: the model's."""

    source: str
    prompt: tuple[int, ...]
    drafter: str
    max_new_tokens: int
    seed: int | None = None
    stop: tuple[str, ...] = ()
    eos_token_id: int | None = None

    def options(self) -> dict[str, Any]:
        """The decoding options of this case (the same for the soaked generator and plain decoding)."""
        options: dict[str, Any] = {"max_new_tokens": self.max_new_tokens}
        if self.seed is not None:
            options.update(do_sample=True, seed=self.seed, **SAMPLING)
        else:
            options["do_sample"] = False
        if self.stop:
            options["stop"] = list(self.stop)
        if self.eos_token_id is not None:
            options["eos_token_id"] = self.eos_token_id
        return options


@dataclass
class SoakRow:
    """What one prompt gave: lengths, the verdict against plain decoding, the store and RSS after it."""

    index: int
    source: str
    drafter: str
    mode: str  # "greedy" or "seed=N", then ", batch of 2" where it was decoded in a batch
    prompt_tokens: int
    new_tokens: int
    stop_reason: str
    steps: int
    accepted: int
    verdict: str  # "identical", "near-tie: ..." or "DIFFERENT: ..."
    acceptable: bool
    store_tokens: int
    rss_mb: float


@dataclass
class SoakReport:
    """Every prompt's row plus the RSS and store figures the pass/fail rules read."""

    rows: list[SoakRow] = field(default_factory=list)
    rss_start_mb: float = 0.0
    rss_warm_mb: float | None = None  # after ``warmup`` prompts
    warmup: int = DEFAULT_WARMUP
    store_budget: int = 0
    evicted_tokens: int = 0  # tokens the store evicted to stay within its budget (by the end)
    rss_growth_bound_mb: float = DEFAULT_RSS_GROWTH_MB
    seconds: float = 0.0
    engine: str = ""  # the soaked generator's engine, as it resolved
    threads: int = 1  # threads calling the one generator
    batch_every: int = 0  # every N-th greedy prompt decoded in a batch of two (0: never)
    batches: int = 0  # the prompts decoded in a batch
    code: dict[str, Any] | None = None  # the checkout's commit and whether it was dirty (None outside git)

    @property
    def identical(self) -> int:
        return sum(row.verdict == "identical" for row in self.rows)

    @property
    def near_ties(self) -> int:
        return sum(row.acceptable and row.verdict != "identical" for row in self.rows)

    @property
    def failures(self) -> list[SoakRow]:
        return [row for row in self.rows if not row.acceptable]

    @property
    def rss_max_mb(self) -> float:
        return max([self.rss_start_mb, *(row.rss_mb for row in self.rows)])

    @property
    def rss_end_mb(self) -> float:
        return self.rows[-1].rss_mb if self.rows else self.rss_start_mb

    @property
    def rss_growth_mb(self) -> float | None:
        """How far RSS rose after the warm-up (None: the soak was not longer than its warm-up).

        One thread: the largest reading after the warm-up minus the reading at its end. Several threads: a
        reading is taken while another thread's generation may be live (a long prompt's KV cache and
        activations, ~90 MiB at 1,500 tokens on the default model), so the largest reading measures two
        generations coinciding, not growth; the rule reads the floor instead, the smallest of the last
        :data:`FLOOR_WINDOW` readings, and takes the largest floor after the warm-up minus the floor at its
        end. A leak lifts every reading and so the floor; a coincidence lifts one reading.
        """
        after = [row.rss_mb for row in self.rows[self.warmup :]]
        if self.rss_warm_mb is None or not after:
            return None
        if self.threads <= 1:
            return max(after) - self.rss_warm_mb
        readings = [row.rss_mb for row in self.rows]
        floors = [min(readings[max(0, i - FLOOR_WINDOW + 1) : i + 1]) for i in range(len(readings))]
        return max(floors[self.warmup :]) - floors[self.warmup - 1]

    @property
    def store_max(self) -> int:
        return max((row.store_tokens for row in self.rows), default=0)

    def problems(self) -> list[str]:
        """Why the soak failed (empty: it passed)."""
        found = [f"prompt {row.index} ({row.source}, {row.drafter}, {row.mode}): {row.verdict}"
                 for row in self.failures]
        over = [row for row in self.rows if row.store_tokens > self.store_budget]
        if over:
            found.append(f"the shared store held {over[0].store_tokens} tokens after prompt {over[0].index}, over its "
                         f"budget of {self.store_budget} ({len(over)} prompts over)")
        growth = self.rss_growth_mb
        if growth is None:
            found.append(f"RSS growth not measured: {len(self.rows)} prompts, no more than the warm-up's "
                         f"{self.warmup}")
        elif growth > self.rss_growth_bound_mb:
            found.append(f"RSS grew {growth:.1f} MiB after the warm-up ({self.warmup} prompts, "
                         f"{self.rss_warm_mb:.1f} MiB), over the bound of {self.rss_growth_bound_mb:g} MiB")
        return found

    def summary(self) -> dict[str, Any]:
        growth = self.rss_growth_mb
        return {
            "prompts": len(self.rows), "prompt_tokens": sum(r.prompt_tokens for r in self.rows),
            "new_tokens": sum(r.new_tokens for r in self.rows), "identical": self.identical,
            "near_ties": self.near_ties, "failures": len(self.failures),
            "accepted_draft_tokens": sum(r.accepted for r in self.rows), "steps": sum(r.steps for r in self.rows),
            "rss_start_mb": round(self.rss_start_mb, 1),
            "rss_warm_mb": None if self.rss_warm_mb is None else round(self.rss_warm_mb, 1),
            "rss_end_mb": round(self.rss_end_mb, 1), "rss_max_mb": round(self.rss_max_mb, 1),
            "rss_growth_mb": None if growth is None else round(growth, 1),
            "rss_growth_bound_mb": self.rss_growth_bound_mb, "warmup": self.warmup,
            "store_budget": self.store_budget, "store_max": self.store_max, "store_evicted": self.evicted_tokens,
            "store_end": self.rows[-1].store_tokens if self.rows else 0, "seconds": round(self.seconds, 1),
            "engine": self.engine, "threads": self.threads, "batch_every": self.batch_every,
            "batched_prompts": self.batches, "commit": (self.code or {}).get("commit"),
            "dirty": (self.code or {}).get("dirty"),
        }


class RotatingFactory:
    """A drafter factory whose next drafter is named before each prompt (module docstring: one generator).

    :meth:`bind` makes the named drafters' factories with the generator's context, once.
    """

    name = "rotating"

    def __init__(self, names: Sequence[str]) -> None:
        if not names:
            raise SpecDecError("the soak needs at least one drafter name")
        self.names = tuple(names)
        self.factories: dict[str, DrafterFactory] = {}
        self.current = self.names[0]

    def bind(self, context: DrafterContext) -> None:
        self.factories = {name: make_factory(name, {}, context) for name in self.names}

    def use(self, name: str) -> None:
        if name not in self.names:
            raise SpecDecError(f"drafter {name!r} is not in the soak's rotation ({', '.join(self.names)})")
        self.current = name

    def create(self) -> Drafter:
        if not self.factories:
            raise SpecDecError("RotatingFactory.bind(context) was not called")
        return self.factories[self.current].create()


def release_free_memory() -> bool:
    """Hand the C allocator's free memory back to the system (glibc's ``malloc_trim(0)``); False where the
    C library has none.

    Why: glibc raises its mmap threshold each time a large block is freed (up to 32 MiB), so later
    tensors of that size come from the heap, and what they leave behind when freed stays resident until
    a trim. A process's RSS then climbs to the high-water of the longest prompt each thread has seen and
    stays there: free memory, not a leak (beside two threads, the default model's RSS rose by ~340 MiB
    over its first 120 prompts, then held flat for 400). Reading RSS after a trim measures what is live,
    so a leak still shows and a high-water does not.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True


def rss_mb() -> float:
    """This process's resident set in MiB after :func:`release_free_memory`: psutil's when installed, else
    /proc/self/statm's."""
    release_free_memory()
    try:
        psutil: Any = importlib.import_module("psutil")  # optional: not a dependency of specdec
    except ImportError:
        resident_pages = int(Path("/proc/self/statm").read_text().split()[1])
        return resident_pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    return float(psutil.Process().memory_info().rss) / 2**20


def build_cases(prompts: Sequence[tuple[str, Sequence[int]]], drafters: Sequence[str] = DRAFTERS,
                new_tokens: Sequence[int] = NEW_TOKENS, stops: Sequence[tuple[str, ...]] = STOPS,
                sample_every: int = 3, eos_every: int = 0, eos_token_id: int | None = None) -> list[SoakCase]:
    """The soak's cases: each prompt (``(source, ids)``, in the order given) with a mix of options.

    Prompt ``i`` gets drafter ``drafters[i % len]``, ``new_tokens[i % len]`` new tokens,
    sampling with seed ``i`` when ``i % sample_every == sample_every - 1`` (else greedy), the
    stop strings ``stops[(i // 2) % len]`` on odd ``i`` (none when ``stops`` is empty), and,
    when ``eos_every`` > 0, ``eos_token_id`` as its end-of-sequence token on every
    ``eos_every``-th prompt (a model with no tokenizer: an early end chosen by id). The
    moduli are coprime with five drafters, so every drafter meets every option.
    """
    cases = []
    for i, (source, ids) in enumerate(prompts):
        sampled = sample_every > 0 and i % sample_every == sample_every - 1
        stop = stops[(i // 2) % len(stops)] if stops and i % 2 == 1 else ()
        eos = eos_token_id if eos_every > 0 and i % eos_every == 0 else None
        cases.append(SoakCase(source, tuple(int(t) for t in ids), drafters[i % len(drafters)],
                              new_tokens[i % len(new_tokens)], seed=i if sampled else None, stop=stop,
                              eos_token_id=eos))
    return cases


def interleave(groups: Sequence[Sequence[tuple[str, Sequence[int]]]]) -> list[tuple[str, Sequence[int]]]:
    """Round-robin over ``groups`` (each kept in order), so every kind of prompt appears early (in the warm-up)."""
    mixed: list[tuple[str, Sequence[int]]] = []
    longest = max((len(g) for g in groups), default=0)
    for i in range(longest):
        mixed.extend(group[i] for group in groups if i < len(group))
    return mixed


def default_prompts(tokenizer: Any, questions_file: str | os.PathLike[str]) -> list[tuple[str, Sequence[int]]]:
    """Every Spec-Bench question's first turn (by category), the held-out and cold-start prompts, and
    :data:`SHORT_PROMPTS`, chat-templated and interleaved (:func:`interleave`)."""
    import json
    from importlib import resources

    from specdec.bench.questions import load_questions
    from specdec.models import encode_prompt

    by_category: dict[str, list[tuple[str, Sequence[int]]]] = {}
    for question in load_questions(questions_file):
        source = f"spec-bench:{question.category}"
        by_category.setdefault(source, []).append((source, encode_prompt(tokenizer, question.turns[0])))
    data = json.loads(resources.files("specdec").joinpath("data/prompts.json").read_text(encoding="utf-8"))
    held_out = [(f"held-out:{p['kind']}", encode_prompt(tokenizer, p["prompt"])) for p in data["heldout"]]
    held_out += [(f"cold-start:{p['kind']}", encode_prompt(tokenizer, p["prompt"])) for p in data["coldstart"]]
    short = [("short", encode_prompt(tokenizer, text)) for text in SHORT_PROMPTS]
    return interleave([*by_category.values(), held_out, short])


Judge = Callable[[Any, Sequence[int], Sequence[int], Sequence[int]], tuple[bool, str]]


def judge_greedy(model: Any, prompt: Sequence[int], ours: Sequence[int], plain: Sequence[int]) -> tuple[bool, str]:
    """(acceptable, verdict) of a greedy output against plain decoding's (:func:`specdec.testing.compare_outputs`)."""
    comparison = compare_outputs(model, prompt, ours, plain)
    if comparison.identical:
        return True, "identical"
    return comparison.acceptable, ("near-tie: " if comparison.acceptable else "DIFFERENT: ") + comparison.describe()


def judge_sampled(ours: Sequence[int], plain: Sequence[int]) -> tuple[bool, str]:
    """(acceptable, verdict) of a sampled output against plain sampling with the same seed: identical or not."""
    if list(ours) == list(plain):
        return True, "identical"
    index = next((i for i, (a, b) in enumerate(zip(ours, plain, strict=False)) if a != b), min(len(ours), len(plain)))
    return False, f"DIFFERENT: sampled output differs from plain sampling (same seed) at new token {index}"


def soak(model: Any, tokenizer: Any, cases: Sequence[SoakCase], *, store: SharedStore | int = DEFAULT_STORE_TOKENS,
         store_budget: int | None = None, warmup: int = DEFAULT_WARMUP,
         rss_growth_mb: float = DEFAULT_RSS_GROWTH_MB, budget: str | int = "auto", engine: str = "auto",
         threads: int = 1, batch_every: int = 0,
         rss: Callable[[], float] = rss_mb, on_row: Callable[[SoakRow], None] | None = None,
         progress: bool = True) -> SoakReport:
    """Run ``cases`` through one generator and check each (module docstring); the report says what failed.

    ``store``: the shared store (or its token budget); ``store_budget``: the budget checked
    (default: the store's own ``max_tokens``). ``warmup``: the prompts after which RSS growth
    is measured. ``threads``: the threads calling the generator; ``batch_every``: every N-th
    greedy prompt decoded in a batch of two (module docstring). ``rss``: the memory reading
    (MiB), replaceable in tests. ``on_row``: called with each prompt's row as it is made (the
    command appends it to ``rows.jsonl``: a soak cut short keeps what it measured).
    """
    from specdec.bench.results import software_versions

    if threads < 1 or batch_every < 0:
        raise SpecDecError(f"the soak needs threads >= 1 and batch_every >= 0, got {threads} and {batch_every}")
    shared = store if isinstance(store, SharedStore) else SharedStore(store)
    rotation = RotatingFactory(sorted({case.drafter for case in cases}) or list(DRAFTERS))
    generator = Generator(model, tokenizer, drafter=rotation, store=shared, budget=budget, engine=engine,
                          planner_cache=False)
    rotation.bind(generator.context)
    plain = Generator(model, tokenizer, drafter="none", store=False, engine=engine, planner_cache=False)
    report = SoakReport(rss_start_mb=rss(), warmup=warmup, rss_growth_bound_mb=rss_growth_mb,
                        store_budget=shared.max_tokens if store_budget is None else store_budget,
                        engine=generator.verifier.description.engine, threads=threads, batch_every=batch_every,
                        code=software_versions()["git"])
    turn = threading.Lock()  # naming the drafter and generating are one step: another thread must not rename it
    done = threading.Lock()  # the report and the bar
    bar = tqdm(total=len(cases), desc="soak", unit="prompt", disable=not progress)
    errors: list[BaseException] = []
    greedy = [index for index, case in enumerate(cases) if case.seed is None and index > 0]
    batched_cases = set(greedy[batch_every - 1 :: batch_every]) if batch_every else set()

    def check(case: SoakCase, index: int) -> SoakRow:
        options = case.options()
        batched = index in batched_cases
        prompts = [list(case.prompt)] + ([list(cases[index - 1].prompt)] if batched else [])
        with turn:
            rotation.use(case.drafter)
            results = (generator.generate_batch(prompts, batch_size=2, **options) if batched
                       else [generator.generate(prompts[0], **options)])
        verdicts = []
        for prompt, ours in zip(prompts, results, strict=True):
            reference = plain.generate(prompt, **options)
            verdicts.append(judge_greedy(model, prompt, ours.tokens, reference.tokens) if case.seed is None
                            else judge_sampled(ours.tokens, reference.tokens))
        acceptable = all(ok for ok, _ in verdicts)
        verdict = next((v for ok, v in verdicts if not ok), next((v for _, v in verdicts if v != "identical"),
                                                                "identical"))
        ours = results[0]
        mode = ("greedy" if case.seed is None else f"seed={case.seed}") + (", batch of 2" if batched else "")
        return SoakRow(index, case.source, case.drafter, mode, len(case.prompt), len(ours.tokens),
                       ours.stats.stop_reason, ours.stats.steps, sum(r.accepted for r in ours.stats.records),
                       verdict, acceptable, shared.num_tokens, rss())

    def worker(first: int) -> None:
        for index in range(first, len(cases), threads):
            if errors:
                return
            try:
                row = check(cases[index], index)
            except BaseException as error:  # re-raised by the caller's thread, after the others stop
                errors.append(error)
                return
            with done:
                report.rows.append(row)
                report.batches += row.mode.endswith("batch of 2")
                if on_row is not None:
                    on_row(row)
                if len(report.rows) == warmup:
                    report.rss_warm_mb = row.rss_mb
                bar.update()
                bar.set_postfix(rss=f"{row.rss_mb:.0f}M", store=row.store_tokens, bad=len(report.failures))

    started = time.perf_counter()
    if threads == 1:
        worker(0)
    else:
        pool = [threading.Thread(target=worker, args=(first,), name=f"soak-{first}") for first in range(threads)]
        for each in pool:
            each.start()
        for each in pool:
            each.join()
    bar.close()
    if errors:
        raise errors[0]
    report.seconds = time.perf_counter() - started
    report.evicted_tokens = shared.evicted_tokens
    return report


def format_report(report: SoakReport, command: str | None = None) -> str:
    """The soak's markdown: the command, the summary table, per drafter and mode, and any problems."""
    s = report.summary()
    lines = [f"`{command}`", ""] if command else []
    lines += ["| figure | value |", "|---|---|"]
    lines += [f"| {key} | {value} |" for key, value in s.items()]
    lines += ["", "| drafter | mode | prompts | new tokens | steps | accepted drafts | identical | near-tie | "
              "failed |", "|---|---|---|---|---|---|---|---|---|"]
    groups: dict[tuple[str, str], list[SoakRow]] = {}
    for row in report.rows:
        groups.setdefault((row.drafter, "greedy" if row.mode.startswith("greedy") else "sampled"), []).append(row)
    for (drafter, mode), rows in sorted(groups.items()):
        lines.append(f"| {drafter} | {mode} | {len(rows)} | {sum(r.new_tokens for r in rows)} | "
                     f"{sum(r.steps for r in rows)} | {sum(r.accepted for r in rows)} | "
                     f"{sum(r.verdict == 'identical' for r in rows)} | "
                     f"{sum(r.acceptable and r.verdict != 'identical' for r in rows)} | "
                     f"{sum(not r.acceptable for r in rows)} |")
    near = [row for row in report.rows if row.acceptable and row.verdict != "identical"]
    if near:
        lines += ["", "Near-ties:", *(f"- prompt {r.index} ({r.source}, {r.drafter}): {r.verdict}" for r in near)]
    problems = report.problems()
    lines += ["", "**FAILED**:" if problems else "**passed**: every output identical to plain decoding (or a "
              "near-tie), the store within its budget, RSS growth within the bound", *(f"- {p}" for p in problems)]
    return "\n".join(lines)


def plot_rss(report: SoakReport, path: str | os.PathLike[str], title: str = "") -> Path:
    """RSS (MiB) and the store's tokens against prompt index; the warm-up's end and the RSS bound marked."""
    plt = pyplot()

    figure, axes = plt.subplots(figsize=(8.0, 4.2))
    indices = [row.index + 1 for row in report.rows]
    axes.plot(indices, [row.rss_mb for row in report.rows], color="tab:blue", label="RSS (MiB)")
    if report.rss_warm_mb is not None:
        axes.axvline(report.warmup, color="grey", linestyle=":", label=f"end of warm-up ({report.warmup})")
        axes.axhline(report.rss_warm_mb + report.rss_growth_bound_mb, color="tab:red", linestyle="--",
                     label=f"bound: warm-up RSS + {report.rss_growth_bound_mb:g} MiB")
    axes.set_xlabel("prompts done")
    axes.set_ylabel("RSS (MiB)")
    store_axes = axes.twinx()
    store_axes.plot(indices, [row.store_tokens for row in report.rows], color="tab:green", alpha=0.5,
                    label="shared store (tokens)")
    store_axes.axhline(report.store_budget, color="tab:green", linestyle="--", alpha=0.5, label="store budget")
    store_axes.set_ylabel("store tokens")
    handles = axes.get_legend_handles_labels()
    more = store_axes.get_legend_handles_labels()
    axes.legend(handles[0] + more[0], handles[1] + more[1], loc="lower right", fontsize=8)
    axes.set_title(title or f"soak: {len(report.rows)} prompts through one Generator")
    return save_figure(figure, path, dpi=110)


def to_json(report: SoakReport) -> dict[str, Any]:
    return {"summary": report.summary(), "problems": report.problems(), "rows": [asdict(r) for r in report.rows]}
