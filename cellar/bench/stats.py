"""Summaries of repeated measurements: every figure Cellar prints is min / median / max."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Spread:
    """The minimum, median and maximum of several runs of one measurement."""

    minimum: float
    median: float
    maximum: float
    runs: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> Spread:
        if not samples:
            raise ValueError("a spread needs at least one sample")
        return cls(min(samples), statistics.median(samples), max(samples), len(samples))

    def as_dict(self) -> dict[str, float]:
        return {"min": self.minimum, "median": self.median, "max": self.maximum,
                "runs": self.runs}

    def describe(self, unit: str, digits: int = 2) -> str:
        return (f"{self.median:.{digits}f} {unit} "
                f"(min {self.minimum:.{digits}f}, max {self.maximum:.{digits}f}, "
                f"{self.runs} runs)")


def percentile(sorted_samples: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile of already sorted samples; `fraction` in [0, 1]."""
    if not sorted_samples:
        raise ValueError("a percentile needs at least one sample")
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must lie in [0, 1], got {fraction}")
    rank = max(0, min(len(sorted_samples) - 1, round(fraction * len(sorted_samples)) - 1))
    return sorted_samples[rank]
