"""The README's `python -m agent.record_snapshot gpus.json` takes one argument, the output
file, and took any one: `python -m agent.record_snapshot --help` started NVML and, on a machine
with a GPU, wrote the snapshot into a file named `--help` (without one it said "cannot record:
NVML unavailable" instead of how to call it). An argument that looks like an option is a usage
error, answered before NVML is touched."""

from __future__ import annotations

import pytest

from agent import record_snapshot


class NoNvml:
    def __init__(self) -> None:
        raise AssertionError("NVML started for a usage error")


@pytest.mark.parametrize("argument", ["--help", "-h", "--out=gpus.json"])
def test_an_option_is_answered_with_the_usage_not_recorded_to(
        argument: str, monkeypatch: pytest.MonkeyPatch, tmp_path: object,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(record_snapshot, "NvmlBackend", NoNvml)
    monkeypatch.chdir(tmp_path)  # type: ignore[arg-type]
    status = record_snapshot.main([argument])
    assert "usage: python -m agent.record_snapshot OUT.json" in capsys.readouterr().err
    assert status in (0, record_snapshot.EXIT_USAGE)
