"""Nothing kept two agents off one state directory (a second started by hand beside
the service, or a restart that overlapped the old process). Each loads the started ledger and
the job records once and rewrites them from its own view: both start the same pod (the ledger
of one does not see the other's starts), each drops the other's job records (jobs no restart
finds again), and their registrations fence each other in turn. The second must refuse to run,
naming the directory, as a second replica on one data directory does."""

from __future__ import annotations

import pathlib

import anyio
import pytest

from agent.daemon import Agent
from agent.fake_backend import FakeGpuBackend
from cellar import agent_cli
from cellar.cli import main
from consensus.envelope import Principal, Role
from consensus.runtime.storage_errors import EXIT_DATA_DIRECTORY_LOCKED, DataDirectoryLocked
from consensus.runtime.storage_lock import DirectoryLock
from tests.agent.agent_support import agent_config, configured_cluster, running_agent, store


@pytest.mark.anyio
async def test_a_second_agent_on_a_state_dir_in_use_refuses_to_run(
        tmp_path: pathlib.Path) -> None:
    gpus = FakeGpuBackend.from_profile("a100-8", seed=1)
    async with configured_cluster() as cluster, running_agent(cluster, "n0", gpus, tmp_path), \
            store(cluster, Principal(Role.NODE, "n0")) as node_store:
        second = Agent(agent_config("n0", tmp_path), FakeGpuBackend.from_profile(
            "a100-8", seed=1), node_store)
        with pytest.raises(DataDirectoryLocked), anyio.fail_after(10):
            await second.run()  # before the fix: it ran, beside the first


def test_cellar_agent_on_a_state_dir_in_use_exits_75_in_one_line(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(agent_cli, "start_logging", lambda args: None)
    state = tmp_path / "state"
    state.mkdir()
    path = tmp_path / "agent.toml"
    path.write_text(f'node = "n1"\nstore = ["127.0.0.1:1"]\ninsecure = true\n'
                    f'backend = "fake:a100-8"\nloop = "asyncio"\nstate_dir = "{state}"\n')
    held = DirectoryLock.acquire(state)
    try:
        assert main(["agent", "--config", str(path)]) == EXIT_DATA_DIRECTORY_LOCKED
    finally:
        held.release()
    error = capsys.readouterr().err
    assert error.startswith(f"cellar agent: state_dir: {state} is in use by process ")
    assert "Traceback" not in error
