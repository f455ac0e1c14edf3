"""Exit status 3 says the cluster never started: a run that served and was checked, and then
failed (writing its report on a full disk), exits 2, no verdict, and says where its history is."""

from __future__ import annotations

import pathlib

import pytest

from cellar.cli import main
from cellar.live import run as live_run
from cellar.live.workload import Outcomes
from jepsen.history import EventType, HistoryRecorder

pytestmark = [pytest.mark.live]


class _NoCluster:
    def __init__(self, layout: object, death_signal: object) -> None: ...

    def start(self, *, rejoin: bool = False) -> None: ...

    def wait_ports(self) -> None: ...

    def stop(self) -> None: ...


def test_a_run_that_served_and_then_could_not_write_its_report_is_not_called_unstarted(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The cluster started, the clients ran, the history was recorded and checked; then writing
    report.html failed (the disk filled up). The command said "the run could not start" and
    exited 3 (README: "bad arguments, or the cluster never started")."""
    async def served(options: object, layout: object, cluster: object, relays: object,
                     recorder: HistoryRecorder) -> object:
        recorder.ok(recorder.invoke(0, "put", "0.1", key="k0"))
        outcomes = Outcomes()
        outcomes.add(0.0, EventType.OK)
        return live_run._Phases((), type("W", (), {"outcomes": outcomes})(), (1, 1), ())

    def disk_full(*args: object) -> str:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(live_run, "ProcessCluster", _NoCluster)
    monkeypatch.setattr(live_run, "_run_phases", served)
    monkeypatch.setattr(live_run, "html_report", disk_full)
    status = main(["live", "--seconds", "1", "--dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert "could not start" not in err, err
    assert status == 2 and "with no verdict" in err
