"""`cellar bench checker` prints figures (never asserts speed): it runs, and says what it timed."""

from __future__ import annotations

import json
import pathlib

import pytest

from cellar.bench.checker import WORKLOADS
from cellar.cli import main

PUBLISHED = pathlib.Path(__file__).resolve().parent / "data" / "published"


def test_the_simulated_histories(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "checker", "--runs", "1", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    rows = document["histories"]
    assert [row["name"] for row in rows] == list(WORKLOADS)
    assert all(row["verdict"] == "linearizable" for row in rows)
    assert max(row["operations"] for row in rows) >= 10_000
    assert max(row["partitions"] for row in rows) >= 100
    assert all(row["operations_per_second"] > 0 for row in rows)


def test_files(capsys: pytest.CaptureFixture[str]) -> None:
    files = [str(PUBLISHED / "jepsen-etcd" / name) for name in ("etcd_000.log", "etcd_002.log")]
    assert main(["bench", "checker", "--runs", "2", "--files", *files]) == 0
    out = capsys.readouterr().out
    assert "median of 2 runs" in out
    assert "etcd_000.log" in out
    assert "not-linearizable" in out
