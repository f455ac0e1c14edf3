"""Job logs stay bounded: a job's log lives in the agent's state directory, next to its ledger
and records, so one chatty job must not fill that disk. The runner cuts a running job's log
past `log_bytes_max`, keeping its tail beside it, and prunes old logs with their tails."""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any

import pytest

from agent.job_logs import cap_log, open_log, prev_path, prune_logs
from tests.agent.jobs_support import QUICK, binding, next_exit, runner

BYTES_MAX = 64 * 1024
TAIL_BYTES = 4 * 1024
SMALL_LOGS = dataclasses.replace(QUICK, log_bytes_max=BYTES_MAX, log_tail_bytes=TAIL_BYTES,
                                 log_poll_s=0.02)

# Writes four times the limit, then waits (up to 10 s) to see its own output cut: the
# descriptor appends, so what it writes after the cut lands at the start, with no hole.
CHATTY = ("import os, time; "
          f"os.write(1, (b'x' * 1023 + b'\\n') * {4 * BYTES_MAX // 1024}); "
          "deadline = time.monotonic() + 10; "
          f"[time.sleep(0.01) for _ in iter(lambda: os.fstat(1).st_size > {BYTES_MAX} "
          "and time.monotonic() < deadline, False)]; "
          f"print('cut' if os.fstat(1).st_size <= {BYTES_MAX} else 'never cut', flush=True)")


@pytest.mark.anyio
async def test_a_chatty_job_s_log_is_cut_while_it_runs(rig) -> None:
    async with runner(rig.state, rig.gpus, SMALL_LOGS) as jobs:
        started = await rig.start(jobs, binding("chatty", CHATTY))
        assert (await next_exit(jobs)).exit_code == 0
    log = pathlib.Path(started.log_path)
    assert log.read_text() == "cut\n"
    tail = prev_path(log).read_text()
    assert len(tail) == TAIL_BYTES and tail.endswith("x\n")


def test_a_log_past_its_limit_keeps_only_its_tail(tmp_path: pathlib.Path) -> None:
    log = tmp_path / "p.log"
    fd = open_log(log)
    try:
        os.write(fd, b"a" * 100 + b"b" * 10)
        assert not cap_log(log, bytes_max=110, tail_bytes=10)
        assert cap_log(log, bytes_max=100, tail_bytes=10)
        assert prev_path(log).read_bytes() == b"b" * 10
        os.write(fd, b"after")  # an appending writer goes on at the new end: no hole
    finally:
        os.close(fd)
    assert log.read_bytes() == b"after"


def test_a_pruned_log_takes_its_tail_with_it(tmp_path: pathlib.Path) -> None:
    old, new = tmp_path / "old.log", tmp_path / "new.log"
    for index, path in enumerate((old, new)):
        path.write_text("x")
        prev_path(path).write_text("tail")
        os.utime(path, ns=(index * 10**9, index * 10**9))
    prune_logs(tmp_path, kept_max=1, keep=())
    assert sorted(path.name for path in tmp_path.iterdir()) == ["new.log", "new.log.prev"]


@pytest.mark.parametrize(("changes", "message"), [
    ({"log_bytes_max": 0}, "log_bytes_max must be at least 1"),
    ({"log_tail_bytes": 2 * QUICK.log_bytes_max}, "log_tail_bytes must not exceed"),
    ({"log_poll_s": 0.0}, "log_poll_s must be positive"),
])
def test_log_limits_are_validated(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(QUICK, **changes).validate()
