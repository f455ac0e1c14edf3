"""The two images of `cellar bench peers`: throughput against concurrent callers (one line per
system, 16 B and 1 KB puts side by side, log-x) and one-caller p50/p99 latency bars.

Each system's line has a colour of its own (`line_style`: matplotlib's default cycle has ten,
and a full run has twelve systems, so cellar-3 and pysyncobj had both been blue), and the
peers' lines are dashed with square markers, Cellar's solid with round ones.

matplotlib is a dev dependency, imported only here and only when plotting (Agg backend, no
display); without it `write_plots` says so and the run goes on without images.
"""

from __future__ import annotations

import pathlib
from typing import TYPE_CHECKING

from cellar.bench.peers.report import SIZE_TEXT, Results, SystemOutcome
from cellar.bench.peers.workload import SIZES_BYTES, point_name, put_label, single_name

if TYPE_CHECKING:
    from matplotlib.axes import Axes

THROUGHPUT_PNG = "throughput.png"
LATENCY_PNG = "latency.png"
# Twenty distinct colours (matplotlib's "tab20", dark shades first): more than any run's systems.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896",
           "#c5b0d5", "#c49c94", "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5")


def line_style(index: int, system: str) -> tuple[str, str]:
    """The colour and the format (marker and line, as matplotlib writes them: "o-", "s--") of
    the `index`th system measured, named `system`."""
    return PALETTE[index % len(PALETTE)], "o-" if system.startswith("cellar") else "s--"


def write_plots(results: Results, directory: pathlib.Path) -> tuple[list[str], str | None]:
    """The file names written under `directory`, and a message when nothing could be."""
    try:
        import matplotlib  # noqa: PLC0415 - optional, and slow to import

        matplotlib.use("Agg")
        from matplotlib import pyplot  # noqa: PLC0415
    except ImportError:
        return [], "matplotlib is not installed: no images (pip install matplotlib)"
    measured = [outcome for outcome in results.systems if outcome.skipped is None]
    figure, axes = pyplot.subplots(1, len(SIZES_BYTES), figsize=(12, 4.5), sharey=False)
    for axis, size in zip(axes, SIZES_BYTES, strict=True):
        _throughput(axis, measured, results.clients, size)
    figure.tight_layout()
    figure.savefig(directory / THROUGHPUT_PNG, dpi=120)
    pyplot.close(figure)
    figure, axes = pyplot.subplots(1, len(SIZES_BYTES), figsize=(12, 4.5))
    for axis, size in zip(axes, SIZES_BYTES, strict=True):
        _latency(axis, measured, size)
    figure.tight_layout()
    figure.savefig(directory / LATENCY_PNG, dpi=120)
    pyplot.close(figure)
    return [THROUGHPUT_PNG, LATENCY_PNG], None


def _throughput(axis: Axes, systems: list[SystemOutcome], clients: tuple[int, ...],
                size_bytes: int) -> None:
    for index, outcome in enumerate(systems):
        spreads = outcome.spreads
        points = [(callers, spreads[name]) for callers in clients
                  if (name := f"{point_name(put_label(size_bytes), callers)}_ops_per_s")
                  in spreads]
        if not points:
            continue
        xs = [callers for callers, _ in points]
        medians = [spread.median for _, spread in points]
        errors = [[spread.median - spread.minimum for _, spread in points],
                  [spread.maximum - spread.median for _, spread in points]]
        color, line = line_style(index, outcome.name)
        axis.errorbar(xs, medians, yerr=errors, fmt=line, color=color, capsize=3,
                      label=outcome.name)
    axis.set_xscale("log")
    axis.set_xticks(list(clients), [str(callers) for callers in clients])
    axis.set_xlabel("concurrent callers")
    axis.set_ylabel("puts per second (median, min-max)")
    axis.set_title(f"{SIZE_TEXT[size_bytes]} puts")
    axis.grid(True, alpha=0.3)
    if systems:
        axis.legend()


def _latency(axis: Axes, systems: list[SystemOutcome], size_bytes: int) -> None:
    prefix = single_name(put_label(size_bytes))
    width = 0.38
    for offset, quantile in ((-width / 2, "p50"), (width / 2, "p99")):
        heights = [outcome.spreads.get(f"{prefix}_{quantile}_ms") for outcome in systems]
        axis.bar([index + offset for index in range(len(systems))],
                 [float("nan") if spread is None else spread.median for spread in heights],
                 width, label=quantile)
    axis.set_xticks(range(len(systems)), [outcome.name for outcome in systems], rotation=30,
                    ha="right")
    axis.set_yscale("log")  # PySyncObj's batched 100 ms beside everyone's 1-10 ms
    axis.set_ylabel("ms (median over rounds, log scale)")
    axis.set_title(f"one caller, {SIZE_TEXT[size_bytes]} puts")
    axis.grid(True, axis="y", alpha=0.3)
    if systems:
        axis.legend()
