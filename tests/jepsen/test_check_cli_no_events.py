"""`cellar check` on a history with no events at all (a file of no lines, or only the native
header a `cellar live` run interrupted before its first operation leaves) checks nothing: its
summary says so, as it does for a history of nemesis events only, rather than print a bare
"linearizable"."""

from __future__ import annotations

import pathlib

import pytest

from cellar.cli import main


@pytest.mark.parametrize("text", ["", '{"cellar-history": 1}\n'])
def test_a_history_of_no_events_is_not_passed_over_in_silence(
        capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path, text: str) -> None:
    path = tmp_path / "history.jsonl"
    path.write_text(text)
    status = main(["check", str(path), "--model", "kv"])
    out = capsys.readouterr().out
    assert status == 0  # nothing refutes it, as for a history of nemesis events only
    assert "warning: it holds no client operation: nothing was checked" in out
