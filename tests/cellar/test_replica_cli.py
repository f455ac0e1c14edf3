"""`cellar replica` (and `cellar agent`'s TLS check): a storage failure while it runs ends it with
the storage error's own exit status and message, though the error is raised deep inside the
node's task groups; bad TLS material or a port in use ends it with a message and an exit status
of its own, never a traceback out of the event loop; `--init` never replaces a lost log, and the
local cluster passes it on a replica's first start only."""

from __future__ import annotations

import errno
import pathlib
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from anyio.abc import TaskStatus

from cellar import agent_cli, replica_cli
from cellar.cli import main
from cellar.daemon_process import EXIT_CONFIG, EXIT_UNAVAILABLE
from cellar.local_cluster import HOST, AgentProcess, Layout, ReplicaProcess
from consensus.records import EpochRecord, RejoinRecord
from consensus.runtime.data_identity import IDENTITY_NAME, DataIdentity
from consensus.runtime.node import replica_config, start_replica
from consensus.runtime.storage import LOG_NAME, DurableLog
from consensus.runtime.storage_errors import (
    EXIT_DATA_DIRECTORY_MISSING,
    EXIT_STORAGE_FAILED,
    StorageFailed,
)
from consensus.runtime.storage_lock import LOCK_NAME


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
def quiet_cli(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(replica_cli, "start_logging", lambda args: None)  # this process's
    switch_interval_s = sys.getswitchinterval()
    yield
    sys.setswitchinterval(switch_interval_s)


@pytest.fixture
def failing_replica(monkeypatch: pytest.MonkeyPatch, quiet_cli: None) -> None:
    monkeypatch.setattr(replica_cli, "ReplicaNode", FailingNode)


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


def test_init_on_a_used_directory_whose_log_is_gone_is_refused(
        tmp_path: pathlib.Path, quiet_cli: None, capsys: pytest.CaptureFixture[str]) -> None:
    layout = Layout(tmp_path / "cluster", 3, insecure=True, loop="asyncio")
    layout.write()
    layout.data_dir(0).mkdir()
    (layout.data_dir(0) / LOCK_NAME).write_text("4242\n")  # a replica ran here
    assert main(["replica", "--config", str(layout.config_path(0)), "--init"]) == \
        EXIT_DATA_DIRECTORY_MISSING
    error = capsys.readouterr().err
    assert error.startswith(f"cellar replica: {layout.data_dir(0) / LOG_NAME}: the data "
                            "directory") and "not empty (cellar.lock)" in error
    assert not (layout.data_dir(0) / LOG_NAME).exists()


def test_a_local_replica_is_started_with_init_the_first_time_only(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Restarts (a crash fault, `cellar dev`'s failover) go without --init, as an operator's
    do: a restart whose log is gone is refused, not begun afresh; a replica whose directory
    was deleted (a live run's wipe) starts with --rejoin, never --init."""
    commands: list[list[str]] = []

    class Started:
        def __init__(self, command: list[str], **kwargs: Any) -> None:
            commands.append(command)

    monkeypatch.setattr(subprocess, "Popen", Started)
    layout = Layout(tmp_path / "cluster", 3, insecure=True)
    layout.directory.mkdir(parents=True)
    process = ReplicaProcess(layout, 1)
    process.start()
    process.start()
    process.start(rejoin=True)
    assert [("--init" in command, "--rejoin" in command) for command in commands] == [
        (True, False), (False, False), (False, True)]
    assert all(str(layout.config_path(1)) in command for command in commands)


def tls_layout(tmp_path: pathlib.Path) -> Layout:
    layout = Layout(tmp_path / "cluster", 3, loop="asyncio")
    layout.write()
    return layout


def run_replica_0(layout: Layout) -> int:
    return main(["replica", "--config", str(layout.config_path(0)), "--init"])


def test_a_key_that_does_not_match_the_certificate_is_refused_before_the_data_directory(
        tmp_path: pathlib.Path, quiet_cli: None, capsys: pytest.CaptureFixture[str]) -> None:
    layout = tls_layout(tmp_path)
    key = layout.certs / "replica-0.key"
    key.write_bytes((layout.certs / "replica-1.key").read_bytes())  # a key, but not its own
    assert run_replica_0(layout) == EXIT_CONFIG
    error = capsys.readouterr().err
    assert error == f"cellar replica: tls.key: {key} does not match the certificate " \
        f"{layout.certs / 'replica-0.pem'}\n"
    assert not layout.data_dir(0).exists()


def test_a_key_file_that_is_not_a_key_is_refused_with_its_name(
        tmp_path: pathlib.Path, quiet_cli: None, capsys: pytest.CaptureFixture[str]) -> None:
    layout = tls_layout(tmp_path)
    key = layout.certs / "replica-0.key"
    key.write_text("not a key\n")
    assert run_replica_0(layout) == EXIT_CONFIG
    error = capsys.readouterr().err
    assert error.startswith(f"cellar replica: tls.key: {key} ") and error.count("\n") == 1
    assert not layout.data_dir(0).exists()


def test_a_certificate_naming_another_replica_is_refused_before_the_data_directory(
        tmp_path: pathlib.Path, quiet_cli: None, capsys: pytest.CaptureFixture[str]) -> None:
    """A file copied from another replica's: its peers would take this replica for that one,
    and drop the real one's link."""
    layout = tls_layout(tmp_path)
    for suffix in ("pem", "key"):
        (layout.certs / f"replica-0.{suffix}").write_bytes(
            (layout.certs / f"replica-1.{suffix}").read_bytes())
    assert run_replica_0(layout) == EXIT_CONFIG
    assert capsys.readouterr().err == f"cellar replica: tls.cert: " \
        f"{layout.certs / 'replica-0.pem'} names cellar://replica/1, not cellar://replica/0\n"
    assert not layout.data_dir(0).exists()


def test_a_client_port_in_use_is_reported_in_one_line_with_its_own_status(
        tmp_path: pathlib.Path, quiet_cli: None, capsys: pytest.CaptureFixture[str]) -> None:
    layout = tls_layout(tmp_path)
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind((HOST, layout.client_ports[0]))
        busy.listen()
        assert run_replica_0(layout) == EXIT_UNAVAILABLE
    error = capsys.readouterr().err
    assert error == f"cellar replica: cannot listen on {HOST}:{layout.client_ports[0]} " \
        "(Address already in use)\n"


def test_an_agent_whose_key_does_not_match_its_certificate_is_refused_with_its_name(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent checks its TLS files at start as the replica does: a traceback from deep in
    its first connection had been the only sign."""
    monkeypatch.setattr(agent_cli, "start_logging", lambda args: None)
    layout = Layout(tmp_path / "cluster", 3, loop="asyncio")
    layout.write(nodes=["node-00", "node-01"])
    agent = AgentProcess(layout, "node-00")
    agent.write()
    key = layout.certs / "node-node-00.key"
    key.write_bytes((layout.certs / "node-node-01.key").read_bytes())
    assert main(["agent", "--config", str(agent.config_path)]) == EXIT_CONFIG
    assert capsys.readouterr().err.startswith(f"cellar agent: {key} does not match")


def test_another_replicas_data_directory_is_refused_with_the_config_status(
        tmp_path: pathlib.Path, quiet_cli: None, capsys: pytest.CaptureFixture[str]) -> None:
    """Replica 1's directory copied to where replica 0's configuration points (a disk moved to
    the wrong machine): refused before anything runs, one line naming both."""
    layout = Layout(tmp_path / "cluster", 3, insecure=True, loop="asyncio")
    layout.write()
    DurableLog.open(layout.data_dir(1), create=True, identity=DataIdentity(1, 3)).close()
    shutil.copytree(layout.data_dir(1), layout.data_dir(0))
    assert main(["replica", "--config", str(layout.config_path(0))]) == EXIT_CONFIG
    error = capsys.readouterr().err
    assert error.startswith(f"cellar replica: {layout.data_dir(0) / IDENTITY_NAME}: this data "
                            "directory is replica 1 of 3's, but the configuration is replica "
                            "0 of 3 (")
    assert " machine)'s." in error


def test_rejoin_on_a_directory_that_holds_a_replicas_log_is_refused(
        tmp_path: pathlib.Path, quiet_cli: None, capsys: pytest.CaptureFixture[str]) -> None:
    """`--rejoin` is for the first start on a new directory after the old one was lost: on a
    live replica's log it would take part in nothing it had not promised, so it is refused
    before anything starts, and the log is left as it was."""
    layout = Layout(tmp_path / "cluster", 3, insecure=True, loop="asyncio")
    layout.write()
    identity = DataIdentity(0, 3, "gpu")
    with DurableLog.open(layout.data_dir(0), create=True, identity=identity) as log:
        log.append([EpochRecord(1)])  # a replica that started once (an empty log never did)
        log.sync()
    before = (layout.data_dir(0) / LOG_NAME).read_bytes()
    assert main(["replica", "--config", str(layout.config_path(0)), "--rejoin"]) == EXIT_CONFIG
    error = capsys.readouterr().err
    assert "--rejoin is only for the first start on a new, empty data directory" in error
    assert (layout.data_dir(0) / LOG_NAME).read_bytes() == before


def test_init_and_rejoin_together_are_a_usage_error(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    layout = Layout(tmp_path / "cluster", 3, insecure=True, loop="asyncio")
    layout.write()
    with pytest.raises(SystemExit) as exit_:
        main(["replica", "--config", str(layout.config_path(0)), "--init", "--rejoin"])
    assert exit_.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
    assert not layout.data_dir(0).exists()


def test_rejoin_again_on_a_directory_still_asking_goes_on_asking(
        tmp_path: pathlib.Path, quiet_cli: None, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The README: a restart in the middle of a rejoin goes on asking, with or without the
    flag. With `--rejoin` again on the directory the first rejoining start created (it never
    heard every report), the replica starts (still asking): no traceback, no refusal."""
    layout = Layout(tmp_path / "cluster", 3, insecure=True, loop="asyncio")
    layout.write()
    with DurableLog.open(layout.data_dir(1), create=True,
                         identity=DataIdentity(1, 3, "gpu")) as log:
        log.append([RejoinRecord(False, 0, ())])
        log.sync()
    started: list[bool] = []

    class Started:
        """Builds the core as the node does, then stops the replica as a failed sync would."""

        def __init__(self, config: Any, log: DurableLog, *args: Any, rejoin: bool = False,
                     **kwargs: Any) -> None:
            started.append(start_replica(replica_config(config), log,
                                         rejoin=rejoin).rejoining_now)
            raise StorageFailed(pathlib.Path(config.data_dir) / "log", "fdatasync",
                                OSError(errno.EIO, "I/O error"))

    monkeypatch.setattr(replica_cli, "ReplicaNode", Started)
    for flags in (["--rejoin"], []):
        assert main(["replica", "--config", str(layout.config_path(1)), *flags]) == \
            EXIT_STORAGE_FAILED
    assert started == [True, True]
    assert "--rejoin is only for" not in capsys.readouterr().err
