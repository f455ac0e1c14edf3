"""`cellar bench cluster` prints figures (never asserts speed): one short run on real replica
processes yields every figure the issue names, and leaves nothing behind."""

from __future__ import annotations

import json
import math
import pathlib

import pytest

from cellar.cli import main

FIGURES = ("commits_per_s", "p50_ms", "p99_ms", "low_p50_ms", "low_p99_ms", "reads_per_s",
           "read_p50_ms", "failover_ms")


@pytest.mark.timeout(120)
def test_one_short_run_reports_every_figure(tmp_path: pathlib.Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "cluster", "--runs", "1", "--clients", "3", "--seconds", "0.5",
                 "--low-seconds", "0.3", "--json", "--dir", str(tmp_path)]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["replicas"] == 3 and document["tls"] is True
    for name in FIGURES:
        assert math.isfinite(document[name]) and document[name] > 0, name
        assert document["spread"][name]["runs"] == 1
    assert document["p99_ms"] >= document["p50_ms"]
    assert list(tmp_path.iterdir()) == []
