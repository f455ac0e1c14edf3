"""The garbage-collector settings of Cellar's busy processes: replicas and load generators.

CPython collects its young generation every 700 net allocations of container objects, and a
young collection walks every object made since the last one that is still alive. In a process
with hundreds of requests in flight those are thousands (requests, waiters, futures, frames):
in the benchmark's load generator at 256 callers a young collection took about 2 ms, and 280
of them took 0.6 s of a 10-s run. Collecting every 20,000 allocations instead, most objects
die before a collection sees them: 2 collections, 0.01 s, in the same run. Everything alive
at start (modules, classes) lives as long as the process, so it is frozen out of the
collector's sight: full collections no longer walk it (they were 15 % of an idle replica's
time).

A library does not change its host's collector: an application embedding the client wraps
its own work in `quiet_garbage_collector()` if it wants the same. On leaving, the settings are
as they were and the frozen objects are in the collector's sight again.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

GC_THRESHOLDS = (20_000, 20, 20)  # young-generation allocations, then collections per older


@contextlib.contextmanager
def quiet_garbage_collector() -> Iterator[None]:
    """Collect once, freeze what is alive, and collect the young generation less often, until
    the block ends."""
    thresholds = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
