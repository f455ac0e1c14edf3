"""`cellar bench storage` prints figures (never asserts speed): it runs every store, reads back
what it wrote, and leaves nothing behind in the directory it measured."""

from __future__ import annotations

import json
import pathlib

import pytest

from cellar.bench.storage import BATCH_SIZES, sample_records
from cellar.cli import main


def test_json_figures_for_every_store(tmp_path: pathlib.Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "storage", "--runs", "1", "--syncs", "2", "--records", "300",
                 "--json", "--dir", str(tmp_path)]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [row["batch"] for row in document["appends"]] == list(BATCH_SIZES)
    for row in document["appends"]:
        for store in ("log", "log_unzeroed", "sqlite"):
            assert row[store]["records_per_second"] >= row[store]["syncs_per_second"] > 0
    recovery = document["recovery"]
    assert recovery["records"] == 300
    assert all(recovery[name]["median"] > 0
               for name in ("log", "log_unzeroed", "sqlite", "decode_only"))
    assert {row["bytes"] for row in document["checksums"]} == {128, 4096, 4 << 20}
    assert list(tmp_path.iterdir()) == []


def test_the_table(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "storage", "--runs", "1", "--syncs", "1", "--records", "50",
                 "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "sqlite" in out and "recovery of 50 records" in out and "crc32" in out


def test_bad_arguments_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["bench", "storage", "--runs", "0"])
    assert stopped.value.code == 2
    assert "argument --runs: must be at least 1, not 0" in capsys.readouterr().err


def test_the_sample_is_deterministic_and_mixed() -> None:
    records = sample_records(200)
    assert records == sample_records(200)
    assert len({type(record).__name__ for record in records}) == 3
