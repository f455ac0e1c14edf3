"""The effects cursor file holds a number the store cannot take as an index (negative, or past
a 64-bit integer: a hand edit, a restore from elsewhere). It was read as is and sent: the store
answered the effects query MALFORMED, which the watch raises as a RuntimeError, not a failure
to reach the store, so the agent died before registering, and again at every restart. A cursor
out of range is unreadable, as one that is not a number is: every effect is replayed."""

from __future__ import annotations

import pathlib

import anyio
import pytest

from agent.pods import EFFECTS_CURSOR, Pods
from agent.store_link import StoreLink
from consensus.validation import INT64_MAX
from statemachine.machine import Machine
from statemachine.store import GpuStore
from tests.agent.jobs_support import WAIT_S, GpuDouble, runner
from tests.statemachine.test_store import MachineClient

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("saved", ["-1", str(INT64_MAX + 1)])
async def test_a_cursor_out_of_range_replays_every_effect(tmp_path: pathlib.Path,
                                                          saved: str) -> None:
    (tmp_path / EFFECTS_CURSOR).write_text(f"{saved}\n", encoding="ascii")
    store = GpuStore(MachineClient(Machine()))  # type: ignore[arg-type]
    async with runner(tmp_path, GpuDouble()) as jobs:
        pods = Pods(StoreLink(store, "n0", retry_ms_max=200), jobs, tmp_path)
        with anyio.fail_after(WAIT_S):
            await pods.skip_covered_effects()
    assert pods._cursor() == 0
