"""Capped exponential backoff with jitter: the pauses between a peer's dials, or between a
client's tries at a command.

Each pause doubles the last, from `initial_s` up to `max_s`, and is drawn in [half, whole] of
it, so that many dialers or clients failing together do not come back together. The generator
is passed in, so a test (or a seeded run) gets the same pauses every time.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass
class Backoff:
    """Exponential delays from `initial_s` to `max_s`, each drawn in [half, whole]."""

    initial_s: float
    max_s: float
    rng: random.Random
    attempts: int = 0

    def next_delay_s(self) -> float:
        ceiling = min(self.max_s, self.initial_s * float(1 << min(self.attempts, 32)))
        self.attempts += 1
        return ceiling * (0.5 + 0.5 * self.rng.random())

    def reset(self) -> None:
        self.attempts = 0
