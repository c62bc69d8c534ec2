"""A plain step against its forward: what ``specdec.run(drafter="none")`` spends outside the model's forward.

For a model and a context ``C`` (``C`` random prompt tokens, then the steps), interleaved, ``repeats``
times each, the median kept:

- ``forward``: the engine's one-node forward alone: the call a plain step makes for the model
  (``engine="specdec"``: the runner's forward over the pending token after the committed ones, with the
  kernels the step runs; another engine: its forward's ``tree``), its KV written where the next step
  overwrites it;
- ``step``: one whole plain step of the default path, :func:`specdec.engine.step` of a lone sequence of
  a :class:`~specdec.api.Generator` with ``drafter="none"`` (its budget planner, guard, recorder and
  stop rules, as :func:`specdec.run` runs it), the context growing by one token a step. Beside them, the
  mean of a fresh generator's first :data:`WARMUP_STEPS` steps (untimed by the median: they hold the
  plain-step kernel trial where the process has no verdict yet, and first-call costs).

Twice: **CPU time on one thread** (``time.process_time`` with ``torch.set_num_threads(1)``: what other
jobs on a shared machine change least) and **wall time on the default threads** (the load follower
on, as a call has it). ``ratio`` = median step / median forward.

**Where the rest goes**: the same steps again with a timer around each part of the step (wrapped on
this bench's own objects, so nothing outside it is touched; each part's own time, nested parts
excluded), mean ms per step: drafting, planning (the planner's guard and plan), checks (the
verifier's token checks), tree inputs (tokens, positions, mask), forward, acceptance (the choice at
each node and the walk), cache commit, drafter update, records (the step's stats), learning (the
planner's and guard's observations), emit and stop rules, load follower; ``python`` is what is left
of the step (the loop's own lines and the timers).
"""

from __future__ import annotations

import random
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from specdec.bench.report import markdown_table
from specdec.budget.batch_planner import LonePlanner, RowGate
from specdec.budget.machine_load import FOLLOWER
from specdec.engine import BatchRequest, LiveSequence, Row, step
from specdec.types import DraftTree

WARMUP_STEPS = 16  # untimed first steps: the plain-step kernel trial (forward.PlainStepTrial), first-call costs
PARTS = ("drafting", "planning", "checks", "tree inputs", "forward", "acceptance", "cache commit",
         "drafter update", "records", "learning", "emit + stop rules", "load follower", "python")  # fmt: skip


class PartClock:
    """Each wrapped part's own seconds (its nested wrapped parts' excluded), summed by part name."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.seconds: dict[str, float] = defaultdict(float)
        self._children: list[float] = []  # per open part: the seconds of the parts nested in it

    def wrap(self, obj: Any, method: str, part: str) -> None:
        """Time ``obj.method`` as ``part`` from now on (an attribute of this instance: its class is untouched)."""
        inner = getattr(obj, method)

        def timed(*args: Any, **kwargs: Any) -> Any:
            self._children.append(0.0)
            started = self.clock()
            try:
                return inner(*args, **kwargs)
            finally:
                elapsed = self.clock() - started
                self.seconds[part] += elapsed - self._children.pop()
                if self._children:
                    self._children[-1] += elapsed

        setattr(obj, method, timed)


def _one_node_forward(verifier: Any, sequence: LiveSequence) -> Callable[[], None]:
    """The forward a plain step makes for the model, alone (module docstring)."""
    forward = verifier.forward
    runner = getattr(forward, "runner", None)

    def run() -> None:
        tree = DraftTree.single(sequence.pending)
        with torch.inference_mode():
            if runner is None:
                forward.tree(sequence.state, tree)
                forward.rewind(sequence.state, sequence.committed_len)
                return
            segment, _ = forward._segment(sequence.state, tree)
            runner.forward([segment], forward._kernels_for(1))

    return run


@contextmanager
def _threads(count: int | None) -> Iterator[None]:
    before = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def measure_context(generator: Any, context: int, repeats: int, clock: Callable[[], float]) -> dict[str, Any]:
    """``{"forward_ms", "step_ms", "ratio", "parts_ms", ...}`` at ``context`` with ``clock`` (module docstring)."""
    verifier = generator.verifier
    rng = random.Random(context)
    prompt = [rng.randrange(verifier.vocab_size) for _ in range(context)]
    steps = WARMUP_STEPS + 2 * repeats
    config = generator.decoding_config(max_new_tokens=steps + 2, ignore_eos=True)
    planner = generator.planner_memory.planner(verifier, config.budget)
    drafter = generator.new_drafter()
    forwards: list[float] = []
    plain: list[float] = []
    parts = PartClock(clock)
    with FOLLOWER.following(verifier.description.device.type == "cpu"):
        sequence = LiveSequence(verifier, drafter, prompt, config, budget=str(planner.budget))
        rows = [Row(BatchRequest(0, sequence.prompt, config), sequence, RowGate())]
        lone = LonePlanner(planner, planner.guard)
        forward_alone = _one_node_forward(verifier, sequence)

        def one_step() -> float:
            started = clock()
            for _ in step(verifier, rows, lone, batch=False):
                pass
            return clock() - started

        trial = getattr(verifier.forward, "plain_trial", None) is not None
        first = [one_step() for _ in range(WARMUP_STEPS)]
        for index in range(repeats):  # the order alternates: a drift of the machine hits both alike
            if index % 2:
                plain.append(one_step())
            started = clock()
            forward_alone()
            forwards.append(clock() - started)
            if index % 2 == 0:
                plain.append(one_step())
        _wrap_parts(parts, verifier, sequence, lone)
        wrapped = [one_step() for _ in range(repeats)]
    counted = sum(parts.seconds.values())
    parts.seconds["python"] = max(sum(wrapped) - counted, 0.0)
    forward_ms, step_ms = 1e3 * statistics.median(forwards), 1e3 * statistics.median(plain)
    return {
        "context": context, "threads": torch.get_num_threads(), "forward_ms": round(forward_ms, 3),
        "step_ms": round(step_ms, 3), "ratio": round(step_ms / forward_ms, 3),
        "wrapped_step_ms": round(1e3 * statistics.mean(wrapped), 3),
        "first_steps_ms": round(1e3 * statistics.mean(first), 3), "kernel_trial": trial,
        "parts_ms": {part: round(1e3 * parts.seconds.get(part, 0.0) / repeats, 3) for part in PARTS},
        "kernels": str(verifier.kernels), "engine": verifier.engine,
    }  # fmt: skip


def _wrap_parts(parts: PartClock, verifier: Any, sequence: LiveSequence, lone: LonePlanner) -> None:
    """Timers around the step's parts (module docstring), on this measurement's own objects."""
    forward = verifier.forward
    wraps: list[tuple[Any, str, str]] = [
        (sequence, "draft", "drafting"), (lone, "guard", "planning"), (lone, "plan", "planning"),
        (lone, "plain_seconds_per_token", "planning"), (verifier, "_check_row", "checks"),
        (verifier, "_accept", "acceptance"), (verifier, "_commit", "cache commit"),
        (sequence, "learn", "drafter update"), (sequence.record, "add_step", "records"),
        (lone, "observe", "learning"), (sequence, "emit", "emit + stop rules"), (FOLLOWER, "tick", "load follower"),
    ]  # fmt: skip
    if hasattr(forward, "_segment"):
        wraps.append((forward, "_segment", "tree inputs"))
    runner = getattr(forward, "runner", None)
    wraps.append((runner, "forward", "forward") if runner is not None else (forward, "tree", "forward"))
    guard = lone.guard(1)
    if guard is not None:
        wraps += [(guard, "drafts", "planning"), (guard, "observe", "learning")]
    for obj, method, part in wraps:
        parts.wrap(obj, method, part)


def measure(
    model: Any, tokenizer: Any, contexts: tuple[int, ...], repeats: int, engine: str = "auto"
) -> dict[str, Any]:
    """Both clocks at every context (module docstring): ``{"rows": [...], ...}``."""
    from specdec.api import Generator

    rows = []
    for mode, threads, clock in (("cpu", 1, time.process_time), ("wall", None, time.perf_counter)):
        with _threads(threads):
            for context in contexts:  # a fresh generator each: FOLLOWER's reading and the kernel trial start anew
                with Generator(model, tokenizer, drafter="none", engine=engine, planner_cache=False) as generator:
                    rows.append({"clock": mode, **measure_context(generator, context, repeats, clock)})
    return {"contexts": list(contexts), "repeats": repeats, "rows": rows}


def markdown(report: dict[str, Any]) -> str:
    """The ratio table, then where each row's step time goes."""
    rows = report["rows"]
    head = markdown_table(
        ["context", "clock", "threads", "forward ms", "plain step ms", "step / forward",
         f"first {WARMUP_STEPS} steps ms (kernel trial)"],
        [[r["context"], r["clock"], r["threads"], f"{r['forward_ms']:.2f}", f"{r['step_ms']:.2f}", f"{r['ratio']:.3f}",
          f"{r['first_steps_ms']:.2f} ({'yes' if r['kernel_trial'] else 'no'})"] for r in rows],
    )  # fmt: skip
    labels = [f"{r['context']} {r['clock']}" for r in rows]
    parts = markdown_table(
        ["ms per step (mean)", *labels],
        [[part, *[f"{r['parts_ms'][part]:.3f}" for r in rows]] for part in PARTS]
        + [["whole step (timed)", *[f"{r['wrapped_step_ms']:.3f}" for r in rows]]],
    )  # fmt: skip
    return f"{head}\n\n{parts}"
