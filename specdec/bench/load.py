"""What a user gets on a machine that is not idle: the one-off measurement beside other work.

A user's machine runs a browser, an IDE, a build. ``specdec bench load`` measures the same calls as
:mod:`specdec.bench.oneoff` under each of several **conditions**, one fresh process each, with
empty caches (no cost table, no planner statistics, no Token Recycling matrix: folders made for
the process), in one sitting:

- ``idle``: nothing else running;
- ``busy:N``: ``N`` processes that only compute (``while True: pass``), started before the measuring
  process and stopped after it;
- ``stream``: one process that streams memory (copies between two 256 MiB arrays), what another
  model or a data job does to the memory bandwidth every decoding step needs.

The prompts are the held-out ones taken one kind after another (:func:`spread_prompts`). In each
process: the **first call** (``specdec.run`` with the first drafter on the first prompt,
before anything else: what a fresh process pays), then :func:`specdec.bench.oneoff.measure_in_process`
over the prompts (per prompt, interleaved: HF greedy ``generate``, one ``run`` per drafter, and a
long-lived warmed ``Generator`` per drafter). Per condition the report gives the first call's
seconds against the warmed Generator's on the same prompt, every arm's mean tokens/s, each
drafter's tokens/s over plain decoding's (``none``) on the mean and the worst prompt, the longest
``run`` call against the warmed Generator's time for the same prompt, and how many outputs equal
HF's; across conditions, ``none``'s tokens/s against its idle figure.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specdec.bench import oneoff
from specdec.bench.methods import parse_methods
from specdec.bench.plot import grouped_bars, write_with_plot
from specdec.bench.report import markdown_table
from specdec.errors import SpecDecError

CHILD_FLAG = "--load-child"
BUSY = "while True: pass"
STREAM = (
    "import numpy as np\n"
    "a = np.ones(1 << 25); b = np.empty_like(a)\n"  # 256 MiB each: far past any last-level cache
    "while True: np.copyto(b, a)"
)


def parse_conditions(text: str) -> list[str]:
    """``"idle,busy:1,stream"`` as a list; anything else is an error naming it.

    >>> parse_conditions("idle, busy:2,stream")
    ['idle', 'busy:2', 'stream']
    """
    conditions = [c.strip() for c in text.split(",") if c.strip()]
    for condition in conditions:
        name, _, count = condition.partition(":")
        if condition in ("idle", "stream") or (name == "busy" and count.isdigit() and int(count) >= 1):
            continue
        raise SpecDecError(f"unknown load condition {condition!r}: give idle, busy:N (N >= 1) or stream")
    if not conditions:
        raise SpecDecError("give at least one load condition (idle, busy:N, stream)")
    return conditions


def spread_prompts(prompts: Sequence[oneoff.Prompt], count: int) -> list[oneoff.Prompt]:
    """The first ``count`` of ``prompts`` taken one kind after another (the held-out prompts come grouped by
    kind: 8 of them are 2 of each of the 4 kinds, not 4 HumanEval and 4 MBPP).

    >>> kinds = [oneoff.Prompt(k, str(i)) for i, k in enumerate("aabbcc")]
    >>> [p.text for p in spread_prompts(kinds, 4)]
    ['0', '2', '4', '1']
    """
    by_kind: dict[str, list[oneoff.Prompt]] = {}
    for prompt in prompts:
        by_kind.setdefault(prompt.kind, []).append(prompt)
    chosen: list[oneoff.Prompt] = []
    for turn in range(max((len(group) for group in by_kind.values()), default=0)):
        chosen.extend(group[turn] for group in by_kind.values() if turn < len(group))
    return chosen[:count]


def _loaders(condition: str) -> list[subprocess.Popen[bytes]]:
    """The processes that make ``condition``'s load (none for idle), started now."""
    if condition == "idle":
        return []
    code = STREAM if condition == "stream" else BUSY
    count = 1 if condition == "stream" else int(condition.split(":")[1])
    return [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(count)]  # fmt: skip


def _stop(loaders: Sequence[subprocess.Popen[bytes]]) -> None:
    for process in loaders:
        process.send_signal(signal.SIGKILL)
        process.wait()


def child_main(payload: str) -> None:
    """One condition's measuring process (module docstring): prints one JSON line on stdout."""
    from specdec.models import encode_prompt, load_model

    data = json.loads(payload)
    started = time.perf_counter()
    model, tokenizer = load_model(None if data["model"] == "default" else data["model"])
    loaded = time.perf_counter() - started
    prompts = spread_prompts(oneoff.heldout_prompts(), data["prompts"])
    (first_spec, *_) = parse_methods([data["drafters"]])
    ids = encode_prompt(tokenizer, prompts[0].text, None)
    first = oneoff.timed_run(model, tokenizer, ids, first_spec, data["max_new_tokens"])
    results = oneoff.measure_in_process(model, tokenizer, prompts, data["drafters"], data["max_new_tokens"],
                                        progress=False)  # fmt: skip
    print(json.dumps({
        "load_s": loaded, "first": {"label": first_spec.label, "seconds": first.seconds, "tokens": first.tokens,
                                    "split": first.split},
        "prompts": oneoff.to_json(results), "summary": oneoff.summarize(results),
    }))  # fmt: skip


def _child_command(payload: str) -> list[str]:
    """This file run as ``__main__`` (below), so ``--code`` can put another specdec on the child's path (the child
    runs in an empty folder: no checkout in its working directory comes first)."""
    run = f"import runpy; runpy.run_path({str(Path(__file__).resolve())!r}, run_name='__main__')"
    return [sys.executable, "-c", run, CHILD_FLAG, payload]


def measure(
    model: str, conditions: Sequence[str], drafters: str, prompts: int, max_new_tokens: int, progress: bool = True,
    codes: Sequence[str] = (),
) -> dict[str, Any]:
    """Every condition in turn, one fresh process each with empty caches (module docstring). ``codes``: other
    specdec checkouts to measure in turn with this one under each condition (``name [dir]`` in the report), so
    old and new code meet the same load minutes apart."""
    from tqdm import tqdm

    report: dict[str, Any] = {"model": model, "drafters": drafters, "prompts": prompts,
                              "max_new_tokens": max_new_tokens, "conditions": {}}  # fmt: skip
    payload = json.dumps({"model": model, "drafters": drafters, "prompts": prompts, "max_new_tokens": max_new_tokens})
    trees: list[str | None] = [None, *codes]
    runs = [(condition, tree) for condition in conditions for tree in trees]
    bar = tqdm(runs, desc="load conditions", unit="process", disable=not progress, file=sys.stderr)
    for condition, tree in bar:
        key = condition if tree is None else f"{condition} [{Path(tree).name}]"
        bar.set_postfix_str(key)
        with tempfile.TemporaryDirectory(prefix="specdec-load-") as empty:
            env = dict(os.environ)
            for kind in ("CALIBRATION", "PLANNER", "RECYCLING"):
                env[f"SPECDEC_{kind}_DIR"] = str(Path(empty) / kind.lower())
            if tree is not None:  # its builds apart: another checkout's build stamps may not read as this one's
                env["PYTHONPATH"] = str(Path(tree).resolve())
                env["SPECDEC_EXTENSIONS_DIR"] = str(Path(tree).resolve() / ".extensions")
            loaders = _loaders(condition)
            try:
                time.sleep(1.0 if loaders else 0.0)  # the loaders are running before the process starts
                done = subprocess.run(_child_command(payload), capture_output=True, text=True, check=False, env=env,
                                      cwd=empty)  # fmt: skip
            finally:
                _stop(loaders)
        if done.returncode != 0:
            raise RuntimeError(f"the measuring process ({key}) failed:\n{done.stderr[-4000:]}")
        report["conditions"][key] = summarize_condition(json.loads(done.stdout.strip().splitlines()[-1]))
        time.sleep(2.0)  # the loaders' CPU time leaves the next condition's first reading
    return report


def summarize_condition(child: dict[str, Any]) -> dict[str, Any]:
    """One condition's figures (module docstring) from its process's output."""
    rows = child["prompts"]
    arms = [arm for arm in rows[0]["arms"] if arm.startswith("run:")]

    def rate(row: dict[str, Any], arm: str) -> float:
        timing = row["arms"][arm]
        return len(timing["tokens"]) / timing["seconds"] if timing["seconds"] > 0 else 0.0

    figures: dict[str, Any] = {"hf_tokens_per_s": sum(rate(r, "hf") for r in rows) / len(rows), "arms": {}}
    for arm in arms:
        label = arm.split(":", 1)[1]
        per_prompt = [rate(r, arm) for r in rows]
        over_none = [rate(r, arm) / rate(r, "run:none") for r in rows] if "run:none" in rows[0]["arms"] else []
        longest = max(rows, key=lambda r: r["arms"][arm]["seconds"])
        over_warmed = [r["arms"][arm]["seconds"] / r["arms"][f"generator:{label}"]["seconds"] for r in rows]
        figures["arms"][label] = {
            "tokens_per_s": sum(per_prompt) / len(per_prompt),
            "over_none_mean": sum(over_none) / len(over_none) if over_none else None,
            "over_none_worst": min(over_none) if over_none else None,
            "longest_call_s": longest["arms"][arm]["seconds"],
            "longest_over_warmed": over_warmed[rows.index(longest)],
            "worst_over_warmed": max(over_warmed),
            "identical": sum(r["verdicts"].get(arm) == "identical" for r in rows),
        }
    first = child["first"]
    figures["first_call"] = {"label": first["label"], "seconds": first["seconds"], "split": first["split"],
                             "warmed_s": rows[0]["arms"][f"generator:{first['label']}"]["seconds"]}  # fmt: skip
    figures["load_s"] = child["load_s"]
    figures["prompts"] = len(rows)
    figures["raw"] = child
    return figures


def format_report(report: dict[str, Any]) -> str:
    """Markdown: one row per condition and drafter, and ``none`` against its idle figure."""
    conditions = report["conditions"]
    rows = []
    for condition, figures in conditions.items():
        code = condition.partition(" ")[2]  # "" for this checkout, "[dir]" for another
        idle = conditions.get(f"idle {code}".strip(), {})
        idle_none = idle.get("arms", {}).get("none", {}).get("tokens_per_s")
        first = figures["first_call"]
        for label, arm in figures["arms"].items():
            vs_idle = ""
            if label == "none" and idle_none:
                vs_idle = f"{arm['tokens_per_s'] / idle_none:.2f}x"
            over = "-"
            if arm["over_none_mean"] is not None:
                over = f"{arm['over_none_mean']:.2f}x; {arm['over_none_worst']:.2f}x"
            first_cell = ""
            if label == first["label"]:
                first_cell = f"{first['seconds']:.2f} / {first['warmed_s']:.2f}"
            hf = f"{figures['hf_tokens_per_s']:.1f}"
            rows.append([condition, label, first_cell, hf, f"{arm['tokens_per_s']:.1f}",
                         vs_idle, over, f"{arm['longest_call_s']:.2f} s ({arm['worst_over_warmed']:.2f}x)",
                         f"{arm['identical']}/{figures['prompts']}"])  # fmt: skip
    header = ["condition", "drafter", "first call / warmed (s)", "HF tok/s", "tok/s", "none vs idle",
              "over none: mean; worst", "longest call (worst call / warmed)", "identical to HF"]  # fmt: skip
    return markdown_table(header, rows) + (
        f"\n\n{report['prompts']} held-out prompts, {report['max_new_tokens']} new tokens, model {report['model']}; "
        "one fresh process per condition with empty caches; `run` calls with default arguments."
    )


def draw(report: dict[str, Any]) -> Any:
    """Tokens/s per condition: HF greedy and each drafter's one-off ``run``."""
    from specdec.bench.plot import pyplot

    plt = pyplot()
    conditions = list(report["conditions"])
    labels = list(next(iter(report["conditions"].values()))["arms"])
    figure, axes = plt.subplots(figsize=(max(6.0, 1.8 * len(conditions) + 2), 4.0))
    series = {"HF greedy": ([report["conditions"][c]["hf_tokens_per_s"] for c in conditions],
                            [f"{report['conditions'][c]['hf_tokens_per_s']:.1f}" for c in conditions])}  # fmt: skip
    for label in labels:
        values = [report["conditions"][c]["arms"][label]["tokens_per_s"] for c in conditions]
        series[f"run({label})"] = (values, [f"{v:.1f}" for v in values])
    grouped_bars(axes, len(conditions), series)
    axes.set_xticks(range(len(conditions)), conditions)
    axes.set_ylabel("tokens/s (mean over prompts)")
    axes.set_title(f"one-off calls beside other work ({report['model']}, {report['prompts']} prompts)", fontsize=9)
    axes.legend(fontsize=7)
    return figure


def write(report: dict[str, Any], out: str | None) -> str:
    """The table; with ``out``, also ``load.json``, ``load.md`` and ``load.png`` there."""
    slim = {**report, "conditions": {c: {k: v for k, v in f.items() if k != "raw"}
                                     for c, f in report["conditions"].items()}}  # fmt: skip
    table = format_report(report)
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "raw.json").write_text(json.dumps(report), encoding="utf-8")
    return write_with_plot(slim, table, out, "load", lambda plt: draw(report))


if __name__ == "__main__":  # a measuring process (_child_command), on whichever specdec its PYTHONPATH names
    child_main(sys.argv[sys.argv.index(CHILD_FLAG) + 1])
