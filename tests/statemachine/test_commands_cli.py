"""Smoke tests of the two commands built on the state machine: `cellar demo` and
`cellar bench statemachine`, run small so they stay quick; they must exit 0 and print their
summary. (The figures themselves are measured by running the benchmark, never asserted.)"""

from __future__ import annotations

import json

import pytest

from cellar.cli import main


def test_the_demo_runs_a_few_rounds_and_summarises(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--rounds", "4", "--pace", "0"]) == 0
    output = capsys.readouterr().out
    assert output.startswith("cellar demo: 1,024 nodes, 8,192 GPUs, 5 tenants")
    assert "[t=  4s]" in output
    assert "a restored copy has the same digest" in output
    assert "invariants: all hold" in output


def test_the_benchmark_prints_one_json_object(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "statemachine", "--json", "--runs", "1", "--commands", "300",
                 "--samples", "3"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["gpus"] == 8192 and figures["nodes"] == 1024
    assert set(figures["alloc_p50_ms"]) == {"1", "8", "64"}
    assert figures["apply_per_s"] > 0 and figures["snapshot_roundtrip_ms"] > 0
    assert figures["workload_commands"] == 300  # as asked, though a step may send several
