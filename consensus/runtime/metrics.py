"""Metrics a replica exports: counters, gauges and latency histograms, in Prometheus text.

Kept small on purpose (no dependency): a registry of named series, each with a help line, and
`render()` producing the text exposition format (version 0.0.4) that Prometheus scrapes.
Histograms use fixed bucket bounds in seconds and keep integer counts, so recording is a
bisect and two additions.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0,
                     5.0)


class Histogram:
    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: Sequence[float] = LATENCY_BUCKETS_S) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.total += value

    def observe_many(self, values: Sequence[float]) -> None:
        """`observe` each of `values`, in order (the same counts and total), in one call."""
        counts, bounds = self.counts, self.bounds
        total = self.total
        for value in values:
            counts[bisect.bisect_left(bounds, value)] += 1
            total += value
        self.total = total
        self.count += len(values)

    def quantile(self, fraction: float) -> float:
        """An upper bound of the given quantile (the bucket bound it falls in)."""
        if not self.count:
            return 0.0
        rank, seen = fraction * self.count, 0
        for bound, count in zip(self.bounds, self.counts, strict=False):
            seen += count
            if seen >= rank:
                return bound
        return float("inf")


class Metrics:
    """A registry: counters and gauges by name, histograms by name."""

    def __init__(self, prefix: str = "cellar") -> None:
        self._prefix = prefix
        self._counters: dict[str, float] = {}
        self._gauges: dict[str, float] = {}
        self._histograms: dict[str, Histogram] = {}
        self._help: dict[str, str] = {}

    def describe(self, name: str, help_text: str) -> None:
        self._help[name] = help_text

    def count(self, name: str, amount: float = 1) -> None:
        self._counters[name] = self._counters.get(name, 0) + amount

    def set(self, name: str, value: float) -> None:
        self._gauges[name] = value

    def observe(self, name: str, value: float) -> None:
        histogram = self._histograms.get(name)
        if histogram is None:
            histogram = self._histograms[name] = Histogram()
        histogram.observe(value)

    def observe_many(self, name: str, values: Sequence[float]) -> None:
        """`observe(name, value)` for each of `values`, in order: one call per batch (the
        driver's latencies, once per Ready). Nothing is made for no values."""
        if not values:
            return
        histogram = self._histograms.get(name)
        if histogram is None:
            histogram = self._histograms[name] = Histogram()
        histogram.observe_many(values)

    def counter(self, name: str) -> float:
        return self._counters.get(name, 0)

    def histogram(self, name: str) -> Histogram:
        return self._histograms.setdefault(name, Histogram())

    def snapshot(self) -> dict[str, float]:
        return {**self._counters, **self._gauges}

    def render(self) -> str:
        lines: list[str] = []
        for name in sorted(self._counters):
            lines += self._header(name, "counter")
            lines.append(f"{self._full(name)} {_number(self._counters[name])}")
        for name in sorted(self._gauges):
            lines += self._header(name, "gauge")
            lines.append(f"{self._full(name)} {_number(self._gauges[name])}")
        for name in sorted(self._histograms):
            lines += self._header(name, "histogram")
            lines += self._histogram_lines(name, self._histograms[name])
        return "\n".join(lines) + "\n"

    def _full(self, name: str) -> str:
        return f"{self._prefix}_{name}".replace(".", "_").replace("-", "_")

    def _header(self, name: str, kind: str) -> list[str]:
        full = self._full(name)
        return [f"# HELP {full} {self._help.get(name, name)}", f"# TYPE {full} {kind}"]

    def _histogram_lines(self, name: str, histogram: Histogram) -> list[str]:
        full, lines, cumulative = self._full(name), [], 0
        for bound, count in zip(histogram.bounds, histogram.counts, strict=False):
            cumulative += count
            lines.append(f'{full}_bucket{{le="{bound}"}} {cumulative}')
        lines.append(f'{full}_bucket{{le="+Inf"}} {histogram.count}')
        lines.append(f"{full}_sum {histogram.total:.6f}")
        lines.append(f"{full}_count {histogram.count}")
        return lines


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.6f}"
