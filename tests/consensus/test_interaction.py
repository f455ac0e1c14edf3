"""Runs the golden protocol scripts in testdata/; `pytest --rewrite` regenerates their
expected output (commit only diffs you have read and understood)."""

from __future__ import annotations

import pathlib

import pytest

from tests.consensus.interaction import render_script, run_script

TESTDATA = pathlib.Path(__file__).parent / "testdata"
SCRIPTS = sorted(TESTDATA.glob("*.txt"))


@pytest.mark.parametrize("path", SCRIPTS, ids=[path.stem for path in SCRIPTS])
def test_golden_script(path: pathlib.Path, rewrite: bool) -> None:
    steps, produced = run_script(path)
    if rewrite:
        path.write_text(render_script(steps, produced), encoding="utf-8")
        return
    for step, output in zip(steps, produced, strict=True):
        assert output == step.expected, f"{path.name}: `{step.command}` produced\n" + \
            "\n".join(output)


def test_there_are_scripts() -> None:
    assert len(SCRIPTS) >= 6
