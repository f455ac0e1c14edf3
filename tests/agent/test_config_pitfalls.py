"""Agent configuration values that were accepted and made the agent misbehave: intervals past
the store's default lease (now warned of), a top-level key written below [models] (taken into
that table in silence), a state_dir that exists but cannot be written (a traceback later, not
exit 78)."""

from __future__ import annotations

import argparse
import os
import pathlib

import pytest

from agent.config import AgentConfigError, load_agent_config, parse_agent_config
from statemachine.spec import PolicySpec

MINIMAL = {"node": "gpu-7", "store": ["127.0.0.1:7100"], "state_dir": "state",
           "insecure": True}


@pytest.mark.parametrize(("name", "value_ms"), [("heartbeat_ms", 6 * PolicySpec().lease_ms),
                                               ("retry_ms_max", 3 * PolicySpec().down_after_ms)])
def test_intervals_past_the_stores_default_lease_are_warned_of(
        name: str, value_ms: int, caplog: pytest.LogCaptureFixture) -> None:
    """A heartbeat past half the store's default lease (a node then Suspect, and Down, between
    two heartbeats), or a back-off ceiling past half its Suspect grace (after a store outage
    the heartbeat lands after the node was judged Down), were taken in silence. The agent
    cannot read the cluster's policy (one may have raised it): warned of, not refused."""
    config = parse_agent_config({**MINIMAL, "intervals": {name: value_ms}},
                                base=pathlib.Path("/etc/cellar"))
    assert getattr(config.intervals, name) == value_ms
    assert f"intervals.{name} = {value_ms} is past" in caplog.text
    caplog.clear()
    parse_agent_config(MINIMAL, base=pathlib.Path("/etc/cellar"))  # the defaults: silent
    assert "intervals." not in caplog.text


def test_a_top_level_key_written_below_models_is_refused(tmp_path: pathlib.Path) -> None:
    """TOML puts every key after a [models] header into that table: `metrics = ...` appended
    at the end of a file whose last table is [models] silently becomes a GPU model mapping,
    and the agent runs with no metrics page (as tls_files already guards for [tls])."""
    path = tmp_path / "agent.toml"
    path.write_text("""
node = "gpu-7"
store = ["127.0.0.1:7100"]
state_dir = "state"
insecure = true
[models]
"NVIDIA H100 80GB HBM3" = "H100"
metrics = "0.0.0.0:9400"
""", encoding="utf-8")
    with pytest.raises(AgentConfigError, match=r"models\.'?metrics"):
        load_agent_config(path)


@pytest.mark.skipif(not pathlib.Path("/sys").is_dir(), reason="needs /sys")
def test_an_unwritable_state_dir_is_a_configuration_error(tmp_path: pathlib.Path) -> None:
    """`cellar agent` promises exit 78 for a state_dir it cannot use; one that exists but
    cannot be written (here /sys, read-only even for root) passes the mkdir check and the
    agent dies later with a traceback."""
    probe = pathlib.Path("/sys") / f"cellar-review-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError:
        pass
    else:
        probe.rmdir()
        pytest.skip("/sys is writable here")
    from cellar.agent_cli import run  # noqa: PLC0415
    from cellar.daemon_process import EXIT_CONFIG  # noqa: PLC0415

    config = tmp_path / "agent.toml"
    config.write_text("""
node = "n0"
store = ["127.0.0.1:1"]
state_dir = "/sys"
insecure = true
loop = "asyncio"
backend = "fake:a100-8"
""", encoding="utf-8")
    args = argparse.Namespace(config=config, log_level="warning", plain_logs=True)
    assert run(args) == EXIT_CONFIG
