"""`cellar bench floor` on a tiny configuration: it starts its servers, measures, reports and
stops them, over TLS and plain TCP."""

from __future__ import annotations

import json

import pytest

from cellar.bench import floor
from cellar.cli import main


@pytest.mark.parametrize("plain", [False, True], ids=["tls", "plain"])
def test_the_floor_reports_both_caller_counts_and_leaves_no_server(
        plain: bool, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    started: list[object] = []
    start = floor._start

    def recording_start(processes: list[object], *args: object) -> int:
        port = start(processes, *args)  # type: ignore[arg-type]
        started.append(processes[-1])
        return port

    monkeypatch.setattr(floor, "_start", recording_start)
    argv = ["bench", "floor", "--runs", "1", "--seconds", "0.3", "--callers", "8", "--json"]
    assert main(argv + (["--plain"] if plain else [])) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tls"] is not plain
    assert set(report["callers"]) == {"1", "8"}
    for figures in report["callers"].values():
        assert figures["puts_per_s"]["median"] > 0
        assert figures["p50_ms"]["median"] > 0
    assert len(started) == 3
    assert all(process.poll() is not None for process in started)  # type: ignore[attr-defined]
