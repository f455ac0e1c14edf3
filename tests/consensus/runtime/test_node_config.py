"""The replica configuration file: a good one loads; every bad one names the key and why."""

from __future__ import annotations

import pathlib
import tomllib
from typing import Any

import pytest

from cellar.local_cluster import Layout
from consensus.config import Defect
from consensus.runtime.node import driver_config, replica_config
from consensus.runtime.node_config import NodeConfigError, load_node_config, parse_node_config

THREE_PEERS = """
[[peers]]
id = 0
peer = "127.0.0.1:7000"
client = "127.0.0.1:7100"
[[peers]]
id = 1
peer = "127.0.0.1:7001"
client = "127.0.0.1:7101"
[[peers]]
id = 2
peer = "127.0.0.1:7002"
client = "127.0.0.1:7102"
"""
GOOD = """
replica_id = 1
data_dir = "data/r1"
insecure = true
loop = "trio"
metrics = "127.0.0.1:9401"
""" + THREE_PEERS + """
[limits]
inputs_max = 100
snapshot_every_bytes = 1048576
"""


def test_a_good_file_loads(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "replica.toml"
    path.write_text(GOOD)
    config = load_node_config(path)
    assert config.replica_id == 1 and config.loop == "trio" and config.insecure
    assert str(config.me.client) == "127.0.0.1:7101"
    assert config.data_dir == tmp_path / "data/r1"
    assert config.limits["inputs_max"] == 100 and config.limits["snapshot_every_slots"] > 0
    assert config.limits["snapshot_every_bytes"] == 1 << 20
    assert str(config.metrics) == "127.0.0.1:9401"
    assert config.machine == "gpu" and config.sync  # the defaults: the GPU store, synced
    assert config.idle_wake_ticks == 4
    assert config.defects == ()  # no deliberate fault unless named


def test_the_key_value_machine_and_unsynced_storage_are_chosen_explicitly() -> None:
    raw = base()
    raw.update(machine="kv", sync=False)
    config = parse_node_config(raw, base=pathlib.Path("."))
    assert config.machine == "kv" and not config.sync


def test_deliberate_defects_reach_the_protocol_core_only_when_named() -> None:
    raw = base()
    raw.update(defects=["local-reads"])
    config = parse_node_config(raw, base=pathlib.Path("."))
    assert config.defects == (Defect.LOCAL_READS,)
    assert replica_config(config).defects == frozenset({Defect.LOCAL_READS})


def test_an_idle_replica_may_be_told_to_wake_every_tick() -> None:
    raw = base()
    raw.update(idle_wake_ticks=1)
    assert parse_node_config(raw, base=pathlib.Path(".")).idle_wake_ticks == 1


def base() -> dict[str, Any]:
    return tomllib.loads(GOOD)


@pytest.mark.parametrize(("change", "message"), [
    (lambda raw: raw.pop("data_dir"), "data_dir: required"),
    (lambda raw: raw.update(replica_id=7), "replica_id: 7 is not among"),
    (lambda raw: raw.update(replica_id="one"), "replica_id: required, an integer"),
    (lambda raw: raw["peers"][1].update(client="localhost"), r"peers\[1\].client"),
    (lambda raw: raw["peers"][2].update(peer="h:99999"), r"peers\[2\].peer"),
    # "²" is a digit to str.isdigit, not to int(): it escaped as a bare ValueError
    (lambda raw: raw["peers"][2].update(peer="h:\u00b2"), r"peers\[2\].peer"),
    (lambda raw: raw["peers"].pop(), "odd number"),
    (lambda raw: raw["peers"][2].update(id=0), "each once"),
    (lambda raw: raw.update(loop="gevent"), "loop: 'gevent'"),
    (lambda raw: raw.update(colour="blue"), "colour: unknown key"),
    (lambda raw: raw.update(insecure=False), "tls: required unless insecure"),
    (lambda raw: raw["limits"].update(inputs_max=0), "limits.inputs_max"),
    (lambda raw: raw["limits"].update(speed=3), "limits.speed: unknown"),
    (lambda raw: raw["limits"].update(frame_bytes_max=65536),
     "limits.frame_bytes_max: 65536 is below its floor of 8388608"),
    (lambda raw: raw["limits"].update(frame_bytes_max=(32 << 20) + 1),
     "limits.frame_bytes_max: 33554433 is above its ceiling of 33554432"),
    (lambda raw: raw.update(tick_ms=0), r"tick_ms: 0 is outside"),
    (lambda raw: raw.update(idle_wake_ticks=0), r"idle_wake_ticks: 0 is outside"),
    (lambda raw: raw.update(idle_wake_ticks=101), r"idle_wake_ticks: 101 is outside"),
    (lambda raw: raw.update(machine="sql"), "machine: 'sql' is not one of gpu, kv"),
    (lambda raw: raw.update(sync="no"), "sync"),
    (lambda raw: raw.update(defects=["no-dedup-guard", "typo"]), "defects: a list of"),
    (lambda raw: raw.update(defects="local-reads"), "defects: a list of"),
])
def test_bad_files_name_the_key(change: Any, message: str) -> None:
    raw = base()
    change(raw)
    with pytest.raises(NodeConfigError, match=message):
        parse_node_config(raw, base=pathlib.Path("."))


def test_missing_tls_files_are_named(tmp_path: pathlib.Path) -> None:
    raw = base()
    raw["insecure"] = False
    raw["tls"] = {"ca": "ca.pem", "cert": "c.pem", "key": "k.pem"}
    with pytest.raises(NodeConfigError, match=r"tls\.ca: .*ca\.pem does not exist"):
        parse_node_config(raw, base=tmp_path)


def test_unreadable_and_invalid_files(tmp_path: pathlib.Path) -> None:
    with pytest.raises(NodeConfigError, match="cannot read"):
        load_node_config(tmp_path / "absent.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("replica_id = = 1")
    with pytest.raises(NodeConfigError, match="not valid TOML"):
        load_node_config(bad)
    deep = tmp_path / "deep.toml"
    deep.write_text("replica_id = " + "[" * 100_000 + "]" * 100_000)  # RecursionError escaped
    with pytest.raises(NodeConfigError, match="not valid TOML"):
        load_node_config(deep)


def test_the_snapshot_periods_reach_the_driver(tmp_path: pathlib.Path) -> None:
    layout = Layout(tmp_path / "cluster", 3, insecure=True, loop="asyncio", machine="kv",
                    snapshot_every_slots=300, limits={"snapshot_every_bytes": 4096})
    layout.write()
    driver = driver_config(load_node_config(layout.config_path(0)))
    assert (driver.snapshot_every_slots, driver.snapshot_every_bytes) == (300, 4096)
