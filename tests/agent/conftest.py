"""The job runner's test rig, shared by the agent's job tests: a state directory, GPUs that
answer as the tests set them, and a reaper that kills whatever a test left running."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from tests.agent.jobs_support import GpuDouble, Reaper, Rig


@pytest.fixture
def rig(tmp_path: pathlib.Path) -> Iterator[Rig]:
    setup = Rig(state=tmp_path / "state", gpus=GpuDouble(), reaper=Reaper())
    yield setup
    setup.reaper.kill_all()
