"""`cellar replica`: a storage failure while it runs ends it with the storage error's own exit
status and message, though the error is raised deep inside the node's task groups."""

from __future__ import annotations

import errno
import pathlib
import sys
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from anyio.abc import TaskStatus

from cellar import replica_cli
from cellar.cli import main
from cellar.local_cluster import Layout
from consensus.runtime.storage_errors import EXIT_STORAGE_FAILED, StorageFailed


class FailingNode:
    """A replica node whose durable log fails a sync soon after it starts."""

    def __init__(self, config: Any, log: Any, *args: Any, **kwargs: Any) -> None:
        self.path = pathlib.Path(config.data_dir)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self._sync)
            task_status.started()

    async def _sync(self) -> None:
        await anyio.sleep(0)
        raise StorageFailed(self.path / "log", "fdatasync", OSError(errno.EIO, "I/O error"))


@pytest.fixture
def failing_replica(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(replica_cli, "ReplicaNode", FailingNode)
    monkeypatch.setattr(replica_cli, "start_logging", lambda args: None)  # this process's
    switch_interval_s = sys.getswitchinterval()
    yield
    sys.setswitchinterval(switch_interval_s)


def test_a_failed_sync_exits_with_the_storage_status(
        tmp_path: pathlib.Path, failing_replica: None,
        capsys: pytest.CaptureFixture[str]) -> None:
    layout = Layout(tmp_path / "cluster", 3, insecure=True, loop="asyncio")
    layout.write()
    assert main(["replica", "--config", str(layout.config_path(0)), "--init"]) == \
        EXIT_STORAGE_FAILED
    error = capsys.readouterr().err
    assert error.startswith(f"cellar replica: {layout.data_dir(0) / 'log'}: fdatasync failed")
    assert "Traceback" not in error
