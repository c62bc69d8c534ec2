"""The speedup plot: one group of bars per category, one bar per method, baseline at 1.0.

Drawn with matplotlib's Agg backend (files only, no display), so it works on a server. matplotlib is the
``bench`` extra (``pip install 'specdec-lossless[bench]'``), imported only when a plot is drawn: ``import specdec`` and
``specdec.run`` never need it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specdec.bench.report import summarize
from specdec.bench.results import write_json_atomic


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (files only: no display, no GUI toolkit).

    Raises ImportError naming the extra to install when matplotlib is absent.
    """
    try:
        import matplotlib
    except ImportError as error:
        raise ImportError(
            "specdec's benchmark plots need matplotlib, the 'bench' extra: pip install 'specdec-lossless[bench]'"
        ) from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_with_plot(report: dict[str, Any], table: str, out: str | None, stem: str,
                    draw: Callable[[Any], Any], dpi: int = 130) -> str:
    """``table``; with ``out``, also ``{stem}.json`` (the report), ``{stem}.md`` (the table) and
    ``{stem}.png`` (the figure ``draw(pyplot)`` returns) there: how the measuring subcommands save a run."""
    if out is None:
        return table
    plt = pyplot()
    directory = Path(out)
    write_json_atomic(directory / f"{stem}.json", report)
    (directory / f"{stem}.md").write_text(table + "\n", encoding="utf-8")
    figure = draw(plt)
    figure.tight_layout()
    figure.savefig(directory / f"{stem}.png", dpi=dpi)
    plt.close(figure)
    return table


def plot_speedup(results: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write a PNG of speedup per category per method (the baseline is the dashed line at 1.0)."""
    plt = pyplot()

    summary = summarize(results)
    baseline = results["baseline"]
    labels = [m["label"] for m in results["methods"] if m["label"] != baseline]
    categories = list(summary)
    figure, axes = plt.subplots(figsize=(max(6.0, 1.3 * len(categories) + 1.5), 4.2))
    series = {}
    for label in labels:
        values = [summary[c][label]["speedup"] or 0.0 for c in categories]
        series[label] = (values, [f"{v:.2f}" for v in values])
    grouped_bars(axes, len(categories), series)
    counts = [summary[c][baseline]["questions"] for c in categories]
    axes.set_xticks(range(len(categories)), [f"{c}\n({n})" for c, n in zip(categories, counts, strict=True)],
                    fontsize=8)
    axes.set_ylabel(f"speedup over {baseline} (mean tokens/s)")
    meta = results["meta"]
    axes.set_title(
        f"{meta['model']['name']}, {meta['settings']['max_new_tokens']} new tokens"
        f", {meta['machine']['cpu'] or meta['machine']['platform']}",
        fontsize=8,
    )
    axes.legend(fontsize=7, ncols=min(4, max(1, len(labels))))
    return save_figure(figure, path)


def grouped_bars(
    axes: Any, groups: int, series: dict[str, tuple[list[float], list[str]]], baseline: str | None = None
) -> None:
    """One group of bars per x position (``groups`` of them), one bar per series (its ``(values, bar labels)``
    by legend label), and the dashed baseline at 1.0 (``baseline``: its legend label, None: no legend entry)."""
    width = 0.8 / max(1, len(series))
    for k, (label, (values, texts)) in enumerate(series.items()):
        offsets = [i - 0.4 + width * (k + 0.5) for i in range(groups)]
        bars = axes.bar(offsets, values, width, label=label)
        axes.bar_label(bars, labels=texts, fontsize=6, padding=1)
    axes.axhline(1.0, color="black", linestyle="--", linewidth=0.8, label=baseline)


def save_figure(figure: Any, path: str | os.PathLike[str], dpi: int = 130) -> Path:
    """Lay ``figure`` out, write it to ``path`` as a PNG at ``dpi`` (folders made) and close it."""
    import matplotlib.pyplot as plt

    figure.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=dpi)
    plt.close(figure)
    return out
