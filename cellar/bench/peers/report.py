"""The results of `cellar bench peers` and every way they are shown: the ratios of Cellar to
each peer, the JSON document, the table on stdout and the markdown page.

Every figure is a `Spread` over rounds; ratios are taken between medians and oriented so that
above 1 means Cellar is better (throughput: Cellar / peer; latency: peer / Cellar). A ratio
against a skipped system (or one not in the run) is None, null in JSON.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from cellar.bench.peers.kv import Durability
from cellar.bench.peers.wan import WanRow
from cellar.bench.peers.workload import (
    SIZES_BYTES,
    point_name,
    put_label,
    single_name,
)
from cellar.bench.stats import Spread

HEADLINE_RATIOS = ("ratio_throughput_etcd", "ratio_latency_etcd",
                   "ratio_throughput_pysyncobj", "ratio_latency_pysyncobj")
SIZE_TEXT = {16: "16 B", 1024: "1 KB"}


@dataclass(frozen=True, slots=True)
class SystemOutcome:
    """One system over the whole run: its rounds' figures, or why it was skipped."""

    name: str
    replicas: int | None
    durability: Durability | None
    version: str | None
    rounds: tuple[Mapping[str, float], ...] = ()
    failures: tuple[str, ...] = ()  # rounds abandoned, with the reason
    skipped: str | None = None

    @property
    def spreads(self) -> dict[str, Spread]:
        names = sorted({name for figures in self.rounds for name in figures})
        return {name: Spread.of([figures[name] for figures in self.rounds if name in figures])
                for name in names}


@dataclass(frozen=True, slots=True)
class Results:
    command_line: str
    started_at: str  # ISO 8601, local time with offset
    machine: Mapping[str, object]
    settings: Mapping[str, object]
    clients: tuple[int, ...]
    systems: tuple[SystemOutcome, ...]
    wan: tuple[WanRow, ...] | None  # None: --no-sim

    def system(self, name: str) -> SystemOutcome | None:
        return next((outcome for outcome in self.systems if outcome.name == name), None)


Picker = Callable[[Mapping[str, Spread], Sequence[int]], float | None]


@dataclass(frozen=True, slots=True)
class Metric:
    name: str  # the middle of the ratio's name: ratio_<name>_<peer>
    what: str
    higher_is_better: bool
    pick: Picker


@dataclass(frozen=True, slots=True)
class Pairing:
    """Cellar against one peer: each side's configurations, each ratio taking each side's
    best figure (a user would pick the better configuration for what they need)."""

    label: str  # the end of the ratio's name
    cellars: tuple[str, ...]
    peers: tuple[str, ...]

    @property
    def cellar(self) -> str:
        return " or ".join(self.cellars)

    @property
    def peer(self) -> str:
        return " or ".join(self.peers)


def median_of(figure: str) -> Picker:
    def pick(spreads: Mapping[str, Spread], clients: Sequence[int]) -> float | None:
        del clients
        spread = spreads.get(figure)
        return None if spread is None else spread.median

    return pick


def peak_of(operation: str) -> Picker:
    """The highest median throughput of `operation` ("put_16b", "get") over the caller counts
    it was measured at: each system's own peak, wherever it lies."""
    def pick(spreads: Mapping[str, Spread], clients: Sequence[int]) -> float | None:
        medians = [spreads[name].median for callers in clients
                   if (name := f"{point_name(operation, callers)}_ops_per_s") in spreads]
        return max(medians) if medians else None

    return pick


METRICS = (
    Metric("throughput", "peak 16 B put throughput", True, peak_of(put_label(16))),
    Metric("latency", "one-caller 16 B put p50", False,
           median_of(f"{single_name(put_label(16))}_p50_ms")),
    Metric("throughput_1kb", "peak 1 KB put throughput", True, peak_of(put_label(1024))),
    Metric("latency_1kb", "one-caller 1 KB put p50", False,
           median_of(f"{single_name(put_label(1024))}_p50_ms")),
    Metric("read_throughput", "peak linearizable get throughput", True, peak_of("get")),
    Metric("read_latency", "one-caller linearizable get p50", False,
           median_of(f"{single_name('get')}_p50_ms")),
)
PYSYNCOBJ_CONFIGURATIONS = ("pysyncobj", "pysyncobj-nobatch")
# Cellar's clients spread over the replicas (as SDPaxos intends) or sent to the sequencer's.
CELLAR_SYNCED = ("cellar-3", "cellar-3-seq")
CELLAR_UNSYNCED = ("cellar-3-nosync", "cellar-3-nosync-seq")
ETCD_CONFIGURATIONS = ("etcd", "etcd-leader")
PAIRINGS = (
    Pairing("etcd", CELLAR_SYNCED, ETCD_CONFIGURATIONS),  # both sync every write
    Pairing("pysyncobj", CELLAR_UNSYNCED, PYSYNCOBJ_CONFIGURATIONS),  # neither syncs
    Pairing("pysyncobj_cellar_synced", CELLAR_SYNCED, PYSYNCOBJ_CONFIGURATIONS),  # as it ships
    # Equal terms in transport too: the peers run here without TLS (the headline ratios keep
    # Cellar's TLS, as it ships)
    Pairing("etcd_plain", ("cellar-3-plain-seq",), ETCD_CONFIGURATIONS),
    Pairing("pysyncobj_plain", ("cellar-3-plain-nosync-seq",), PYSYNCOBJ_CONFIGURATIONS),
)


def ratio(cellar: float | None, peer: float | None, *, higher_is_better: bool) -> float | None:
    """Above 1 when Cellar is better; None when either side is missing or zero."""
    if cellar is None or peer is None or not (math.isfinite(cellar) and math.isfinite(peer)):
        return None
    numerator, denominator = (cellar, peer) if higher_is_better else (peer, cellar)
    return numerator / denominator if denominator > 0 else None


def ratios(results: Results) -> dict[str, float | None]:
    found: dict[str, float | None] = {}
    for pairing in PAIRINGS:
        for metric in METRICS:
            cellar = _best_figure(results, pairing.cellars, metric)
            peer = _best_figure(results, pairing.peers, metric)
            found[f"ratio_{metric.name}_{pairing.label}"] = ratio(
                cellar, peer, higher_is_better=metric.higher_is_better)
    return found


def _best_figure(results: Results, systems: Sequence[str], metric: Metric) -> float | None:
    return _best([value for name in systems
                  if (value := _figure(results, name, metric)) is not None],
                 higher_is_better=metric.higher_is_better)


def _best(values: Sequence[float], *, higher_is_better: bool) -> float | None:
    """The better of several configurations' figures; None when there are none."""
    if not values:
        return None
    return max(values) if higher_is_better else min(values)


def _figure(results: Results, system: str, metric: Metric) -> float | None:
    outcome = results.system(system)
    if outcome is None or outcome.skipped is not None:
        return None
    return metric.pick(outcome.spreads, results.clients)


def figure_ratios(results: Results) -> dict[str, dict[str, float | None]]:
    """Every figure both sides of a pairing measured, as a ratio oriented like the headline
    ones (ops/s: Cellar / peer; ms: peer / Cellar), each side's better configuration."""
    found: dict[str, dict[str, float | None]] = {}
    for pairing in PAIRINGS:
        cellars = _spreads_of(results, pairing.cellars)
        if not cellars:
            continue
        peers = _spreads_of(results, pairing.peers)
        table: dict[str, float | None] = {}
        for figure in sorted({figure for spreads in cellars for figure in spreads}):
            higher_is_better = figure.endswith("_ops_per_s")
            if not (higher_is_better or figure.endswith("_ms")) or figure == "failover_ms":
                continue
            ours = [spreads[figure].median for spreads in cellars if figure in spreads]
            theirs = [spreads[figure].median for spreads in peers if figure in spreads]
            if theirs:
                table[figure] = ratio(_best(ours, higher_is_better=higher_is_better),
                                      _best(theirs, higher_is_better=higher_is_better),
                                      higher_is_better=higher_is_better)
        found[pairing.label] = table
    return found


def _spreads_of(results: Results, systems: Sequence[str]) -> list[Mapping[str, Spread]]:
    return [outcome.spreads for name in systems
            if (outcome := results.system(name)) is not None and outcome.skipped is None]


def ratio_meaning(name: str) -> str:
    for pairing in PAIRINGS:
        for metric in METRICS:
            if name == f"ratio_{metric.name}_{pairing.label}":
                order = f"{pairing.cellar} / {pairing.peer}" if metric.higher_is_better \
                    else f"{pairing.peer} / {pairing.cellar}"
                return f"{metric.what}: {order}"
    return name


def as_json(results: Results) -> dict[str, object]:
    """The whole run; the ratios under `ratios` and the headline four at the top level too."""
    found = ratios(results)
    failover = _failover(results)
    document: dict[str, object] = {
        "benchmark": "cellar bench peers", "command_line": results.command_line,
        "started_at": results.started_at, "machine": dict(results.machine),
        "settings": dict(results.settings), "clients": list(results.clients),
        "systems": {outcome.name: _system_json(outcome) for outcome in results.systems},
        "skipped": {outcome.name: outcome.skipped for outcome in results.systems
                    if outcome.skipped is not None},
        "ratios": found, "ratios_by_figure": figure_ratios(results),
        "failover_ms": None if failover is None else failover.as_dict(),
        "sim_wan": None if results.wan is None else [asdict(row) for row in results.wan]}
    document.update({name: found[name] for name in HEADLINE_RATIOS})
    return document


def results_from_json(document: Mapping[str, Any]) -> Results:
    """The `Results` a `results.json` was written from (to redraw its report and plots)."""
    systems = []
    for name, entry in document["systems"].items():
        durability = entry["durability"]
        systems.append(SystemOutcome(
            name, entry["replicas"], None if durability is None else Durability(**durability),
            entry["version"], tuple(entry["rounds"]), tuple(entry["failures"]),
            entry["reason"] if entry["status"] == "skipped" else None))
    wan = document["sim_wan"]
    return Results(document["command_line"], document["started_at"], document["machine"],
                   document["settings"],
                   tuple(document.get("clients") or document["settings"]["clients"]),
                   tuple(systems), None if wan is None else tuple(WanRow(**row) for row in wan))


def _system_json(outcome: SystemOutcome) -> dict[str, object]:
    spreads = outcome.spreads
    return {"status": "skipped" if outcome.skipped is not None else "measured",
            "reason": outcome.skipped, "replicas": outcome.replicas, "version": outcome.version,
            "durability": None if outcome.durability is None else asdict(outcome.durability),
            "rounds": [dict(figures) for figures in outcome.rounds],
            "failures": list(outcome.failures),
            "median": {name: spread.median for name, spread in spreads.items()},
            "spread": {name: spread.as_dict() for name, spread in spreads.items()}}


def _failover(results: Results) -> Spread | None:
    outcome = results.system("cellar-3")
    return None if outcome is None else outcome.spreads.get("failover_ms")


def cell(spread: Spread | None, digits: int) -> str:
    """"812 (790-830)": the median, then the minimum and maximum over rounds."""
    if spread is None:
        return "-"
    if spread.runs == 1:
        return f"{spread.median:.{digits}f}"
    return f"{spread.median:.{digits}f} ({spread.minimum:.{digits}f}-{spread.maximum:.{digits}f})"


def system_rows(outcome: SystemOutcome, clients: Sequence[int]) -> list[tuple[str, ...]]:
    """(what, ops/s, p50 ms, p99 ms) for every phase of one system."""
    spreads = outcome.spreads

    def row(label: str, prefix: str) -> tuple[str, ...]:
        return (label, cell(spreads.get(f"{prefix}_ops_per_s"), 0),
                cell(spreads.get(f"{prefix}_p50_ms"), 2), cell(spreads.get(f"{prefix}_p99_ms"), 2))

    rows = [row(f"put {SIZE_TEXT[size]}, one caller", single_name(put_label(size)))
            for size in SIZES_BYTES]
    rows += [row(f"put {SIZE_TEXT[size]}, {callers} caller{'s' if callers > 1 else ''}",
                 point_name(put_label(size), callers))
             for size in SIZES_BYTES for callers in clients]
    rows.append(row("get, one caller", single_name("get")))
    rows += [row(f"get, {callers} callers", point_name("get", callers)) for callers in clients
             if f"{point_name('get', callers)}_ops_per_s" in spreads]
    return rows


def describe_system(outcome: SystemOutcome) -> str:
    parts = [f"{outcome.replicas} replicas" if outcome.replicas else None,
             None if outcome.durability is None else
             ("synced" if outcome.durability.synced else "not synced")
             + f": {outcome.durability.description}",
             f"version {outcome.version}" if outcome.version else None]
    return "; ".join(part for part in parts if part) or "durability unknown: not loaded"


def _ratio_text(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def table_lines(results: Results) -> list[str]:
    """The human table printed on stdout."""
    rounds = results.settings.get("rounds")
    lines = [f"cellar bench peers: medians (min-max) over {rounds} rounds; callers share "
             f"{results.settings.get('connections')} connections per system"]
    for outcome in results.systems:
        lines.append("")
        lines.append(f"{outcome.name}  [{describe_system(outcome)}]")
        if outcome.skipped is not None:
            lines.append(f"  skipped: {outcome.skipped}")
            continue
        lines.append(f"  {'':<22}{'ops/s':>22}{'p50 ms':>24}{'p99 ms':>24}")
        lines += [f"  {label:<22}{ops:>22}{p50:>24}{p99:>24}"
                  for label, ops, p50, p99 in system_rows(outcome, results.clients)]
        spreads = outcome.spreads
        lines.append(f"  errors / timeouts: {cell(spreads.get('errors'), 0)} / "
                     f"{cell(spreads.get('timeouts'), 0)}")
        lines += [f"  abandoned round: {failure}" for failure in outcome.failures]
        if "failover_ms" in spreads:
            lines.append(f"  sequencer kill to first new commit: "
                         f"{cell(spreads['failover_ms'], 0)} ms")
    found = ratios(results)
    width = max(len(name) for name in found) + 2
    lines += ["", "ratios (above 1: Cellar better; n/a: a side was skipped or not run)"]
    lines += [f"  {name:<{width}}{_ratio_text(value):>8}  {ratio_meaning(name)}"
              for name, value in found.items()]
    return lines


def wan_lines(rows: Sequence[WanRow]) -> list[str]:
    """The simulator's WAN table, as `cellar sim latency` prints it (both deployments)."""
    header = f"  {'replicas':>8} {'site':>5} {'SDPaxos ms':>11} {'Multi-Paxos ms':>15} " \
             f"{'model ms':>9} {'paper ms':>9}"
    lines = ["simulated WAN, median ready latency, sequencer in CA (paper Table 1 RTTs)", header]
    lines += [f"  {row.replicas:>8} {row.site:>5} {row.sdpaxos_ms:>11.1f} "
              f"{row.multipaxos_ms:>15.1f} {row.sdpaxos_model_ms:>9.0f} "
              f"{'-' if row.paper_ms is None else f'{row.paper_ms:.0f}':>9}" for row in rows]
    return lines


def _md_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    def line(cells: Sequence[object]) -> str:
        return "| " + " | ".join(str(value).replace("|", "/") for value in cells) + " |"

    return [line(header), line(["---"] * len(header)), *(line(row) for row in rows), ""]


def _md_machine(results: Results) -> list[str]:
    machine = results.machine
    disk = machine.get("disk")
    disk_text = ", ".join(f"{key} {value}" for key, value in disk.items()) \
        if isinstance(disk, Mapping) else "-"
    return ["## Machine", "", *_md_table(
        ["CPU", "cores", "kernel", "Python", "disk under the clusters' data"],
        [[machine.get("cpu_model"), machine.get("cores"), machine.get("kernel"),
          machine.get("python"), disk_text]])]


def _md_systems(results: Results) -> list[str]:
    rows = [[outcome.name, outcome.replicas or "-", outcome.version or "-",
             "-" if outcome.durability is None else
             ("synced" if outcome.durability.synced else "not synced"),
             "-" if outcome.durability is None else outcome.durability.description,
             outcome.skipped or "measured"] for outcome in results.systems]
    return ["## Systems and their durability", "", *_md_table(
        ["system", "replicas", "version", "synced", "durability", "status"], rows)]


def _md_results(results: Results) -> list[str]:
    lines = [f"## Results (median, min-max over {results.settings.get('rounds')} rounds)", ""]
    for outcome in results.systems:
        if outcome.skipped is not None:
            continue
        lines += [f"### {outcome.name}", "", *_md_table(
            ["phase", "ops/s", "p50 ms", "p99 ms"], system_rows(outcome, results.clients))]
        spreads = outcome.spreads
        lines += [f"Errors {cell(spreads.get('errors'), 0)}, timeouts "
                  f"{cell(spreads.get('timeouts'), 0)}.", ""]
        lines += [f"- abandoned round: {failure}" for failure in outcome.failures]
    return lines


def _md_wan_and_failover(results: Results) -> list[str]:
    failover = _failover(results)
    lines = ["## Failover (cellar-3)", "",
             "Not measured." if failover is None else
             f"SIGKILL of the sequencer to the first commit of a put sent after it: "
             f"{cell(failover, 0)} ms.", ""]
    if results.wan is not None:
        lines += ["## Simulated WAN latency (SDPaxos against Multi-Paxos)", "",
                  "Median ready latency in simulated ms, sequencer in CA, the paper's "
                  "Table 1 round trips (`cellar sim latency`).", "", *_md_table(
                      ["replicas", "site", "SDPaxos ms", "Multi-Paxos ms", "model ms",
                       "paper ms"],
                      [[row.replicas, row.site, f"{row.sdpaxos_ms:.1f}",
                        f"{row.multipaxos_ms:.1f}", f"{row.sdpaxos_model_ms:.0f}",
                        "-" if row.paper_ms is None else f"{row.paper_ms:.0f}"]
                       for row in results.wan])]
    return lines


def _md_figure_ratios(results: Results) -> list[str]:
    by_pairing = figure_ratios(results)
    labels = [pairing.label for pairing in PAIRINGS if by_pairing.get(pairing.label)]
    if not labels:
        return []
    figures = sorted({figure for label in labels for figure in by_pairing[label]})
    rows = [[figure, *("n/a" if (value := by_pairing[label].get(figure)) is None
                       else f"{value:.2f}" for label in labels)] for figure in figures]
    return ["## Every figure as a ratio (above 1: Cellar better)", "", *_md_table(
        ["figure", *labels], rows)]


def markdown(results: Results, images: Sequence[str]) -> str:
    """The report page; `images` are file names beside it (none when matplotlib is absent)."""
    lines = [f"# cellar bench peers, {results.started_at}", "",
             f"Produced by `{results.command_line}`.", "", *_md_machine(results),
             *_md_systems(results), *_md_results(results),
             "## Ratios (above 1: Cellar better)", "", *_md_table(
                 ["ratio", "value", "meaning"],
                 [[name, "n/a" if value is None else f"{value:.2f}", ratio_meaning(name)]
                  for name, value in ratios(results).items()]),
             *_md_figure_ratios(results), *_md_wan_and_failover(results), "## Figures", ""]
    lines += [f"![{image}]({image})" for image in images] or ["(matplotlib not installed)"]
    return "\n".join(lines) + "\n"
