"""`cellar bench agent` prints figures (never asserts speed): one short run reports the agent's
CPU and memory and a fault-to-refusal time for every fault kind."""

from __future__ import annotations

import json
import pathlib

import pytest

from cellar.bench.agent import FAULTS
from cellar.cli import main


@pytest.mark.timeout(120)
def test_one_short_run_reports_every_figure(tmp_path: pathlib.Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "agent", "--seconds", "1", "--runs", "1", "--json",
                 "--dir", str(tmp_path)]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["gpus_per_node"] == 8
    assert figures["agent_cpu_pct"] >= 0 and figures["agent_rss_mib"] > 10
    for kind in FAULTS:
        spread = figures[f"fault_to_refusal_ms_{kind}"]
        assert spread["runs"] == 1 and spread["median"] > 0
    assert list(tmp_path.iterdir()) == []
