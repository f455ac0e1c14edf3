"""The agent's configuration file: a good one loads, every bad key is named."""

from __future__ import annotations

import pathlib

import pytest

from agent.config import AgentConfigError, cluster_model, load_agent_config, parse_agent_config

MINIMAL = {"node": "gpu-7", "store": ["127.0.0.1:7100"], "state_dir": "state",
           "insecure": True}


def test_a_full_file_loads_with_paths_relative_to_it(tmp_path: pathlib.Path) -> None:
    certs = tmp_path / "certs"
    certs.mkdir()
    for name in ("ca.pem", "node-gpu-7.pem", "node-gpu-7.key"):
        (certs / name).write_text("x", encoding="utf-8")
    path = tmp_path / "agent.toml"
    path.write_text("""
node = "gpu-7"
store = ["10.0.0.1:7100", "10.0.0.2:7100", "10.0.0.3:7100"]
state_dir = "state"
metrics = "127.0.0.1:9400"
loop = "trio"
backend = "fake:h100-8"
[tls]
ca = "certs/ca.pem"
cert = "certs/node-gpu-7.pem"
key = "certs/node-gpu-7.key"
[intervals]
poll_ms = 1000
[jobs]
grace_ms = 500
log_bytes_max = 8388608
[models]
"NVIDIA H100 80GB HBM3" = "H100-SXM"
[health]
application_xids = [13, 31]
""", encoding="utf-8")
    config = load_agent_config(path)
    assert config.state_dir == tmp_path / "state"
    assert config.endpoints == ["10.0.0.1:7100", "10.0.0.2:7100", "10.0.0.3:7100"]
    assert config.tls is not None and config.tls.cert == certs / "node-gpu-7.pem"
    assert (config.intervals.poll_ms, config.intervals.heartbeat_ms) == (1000, 2000)
    assert config.jobs.grace_s == 0.5 and config.backend == "fake:h100-8"
    assert config.jobs.log_bytes_max == 8 * 1024 * 1024
    assert config.health.application_xids == frozenset({13, 31})
    assert cluster_model("NVIDIA H100 80GB HBM3", config.models) == "H100-SXM"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"node": ""}, "node: required"),
        ({"store": []}, "store: required"),
        ({"store": ["nowhere"]}, r"store\[0\]: 'nowhere' is not HOST:PORT"),
        ({"loop": "tokio"}, "loop: 'tokio' is not one of"),
        ({"backend": "cuda"}, "backend: 'cuda' is neither"),
        ({"insecure": False}, "tls: required unless insecure"),
        ({"tls": {"ca": "ca.pem"}}, r"insecure: true beside a \[tls\] table"),
        ({"metrics": "[]:9400"}, r"metrics: '\[\]:9400' is not HOST:PORT"),
        ({"intervals": {"poll_ms": 1}}, r"intervals\.poll_ms: 1 is outside"),
        ({"intervals": {"poll_s": 1}}, r"intervals\.poll_s: unknown key"),
        ({"jobs": {"grace_ms": "10s"}}, r"jobs\.grace_ms: required, an integer"),
        ({"jobs": {"grace_s": 10}}, r"jobs\.grace_s: unknown key"),
        ({"jobs": {"log_bytes_max": 1024}}, r"jobs\.log_bytes_max: 1024 is outside"),
        ({"health": {"fail_xids": "79"}}, r"health\.fail_xids: "),
        ({"health": {"colour": 1}}, r"health\.colour: "),
        ({"models": {"X": 3}}, r"models\.'X': must name a GPU model"),
        ({"colour": "blue"}, "colour: unknown key"),
    ],
)
def test_bad_keys_are_named(changes: dict[str, object], message: str) -> None:
    with pytest.raises(AgentConfigError, match=message):
        parse_agent_config({**MINIMAL, **changes}, base=pathlib.Path("/etc/cellar"))


def test_a_missing_file_says_so(tmp_path: pathlib.Path) -> None:
    with pytest.raises(AgentConfigError, match="cannot read"):
        load_agent_config(tmp_path / "absent.toml")


@pytest.mark.parametrize(("name", "model"), [
    ("NVIDIA A100-SXM4-80GB", "A100"), ("NVIDIA H100 80GB HBM3", "H100"),
    ("Tesla V100-SXM2-32GB", "V100"), ("NVIDIA L40S", "L40S")])
def test_nvml_names_map_to_cluster_models(name: str, model: str) -> None:
    assert cluster_model(name, ()) == model
