"""Summaries of repeated measurements: every figure Cellar prints is min / median / max."""

from __future__ import annotations

import math
import os
import pathlib
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction


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
    """The nearest-rank percentile of already sorted samples, `fraction` in (0, 1]: the
    sample of 1-based rank ceil(fraction * n), the smallest sample with at least that fraction
    of the samples at or below it (p50 of 1..5 is 3; p99 of 60 samples is the largest).

    `fraction` is read as the decimal it was written as (0.07 is 7/100, not the binary float
    just above it), so that a rank that comes out whole is not pushed up by the float's error.
    """
    if not sorted_samples:
        raise ValueError("a percentile needs at least one sample")
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must lie in (0, 1], got {fraction}")
    rank = math.ceil(Fraction(repr(float(fraction))) * len(sorted_samples))
    return sorted_samples[rank - 1]


def process_cpu_s(pid: int) -> float:
    """The CPU seconds (user and system) process `pid` has used so far (Linux's /proc)."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1]
    utime, stime = (int(value) for value in fields.split()[11:13])
    return (utime + stime) / os.sysconf("SC_CLK_TCK")
