"""The memory budget of the search must bound the memory it holds.

`check(..., cache_bytes_max=N)` promises that the memoisation holds at most about N bytes, and
that the verdict is `unknown` rather than the process growing past it. The estimate counts
160 bytes and the mask per cached configuration and nothing for the state, "mostly shared with
the stack's". That holds for registers of small values; it does not for states that are new
objects of their own: the strings `append` builds (Porcupine's key-value logs), the whole-map
tuples of an unpartitioned `kv`, the snapshots of the `gpu` model. Each cached configuration
then holds a state of its own, and the search can hold many times its budget.
"""

from __future__ import annotations

import tracemalloc

from jepsen.checker import check
from jepsen.history import HistoryRecorder
from jepsen.models import KvModel
from jepsen.verdict import Verdict

BUDGET = 1 << 20  # 1 MiB for the memoisation
APPENDS = 6
CHUNK = 8_000  # characters each append adds


def _history():
    """Six concurrent appends whose outcome is unknown, then a read no order explains: the
    search visits every order of every subset of them (1,957 configurations), each state a
    string of up to 48,000 characters."""
    recorder = HistoryRecorder()
    handles = [recorder.invoke(process, "append", chr(ord("a") + process) * CHUNK, key="k")
               for process in range(APPENDS)]
    for handle in handles:
        recorder.info(handle)
    read = recorder.invoke(100, "get", key="k")
    recorder.ok(read, "no such value")
    return recorder.history()


def test_the_memory_budget_bounds_the_states_the_search_keeps() -> None:
    history = _history()
    tracemalloc.start()
    try:
        result = check(KvModel(""), history, explain=False, cache_bytes_max=BUDGET)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Either the search stayed within (a small multiple of) its budget, or it said unknown.
    assert result.verdict is Verdict.UNKNOWN or peak < 4 * BUDGET, (
        f"verdict {result.verdict.value} after holding {peak >> 20} MiB "
        f"with a budget of {BUDGET >> 20} MiB")


def test_a_search_that_fits_its_budget_still_settles() -> None:
    history = _history()
    result = check(KvModel(""), history, explain=False, cache_bytes_max=1 << 30)
    assert result.verdict is Verdict.NOT_LINEARIZABLE
