"""`cellar status` judges a majority of the cluster's replicas, not of the endpoints it was
given, and its exit statuses tell apart "fewer than a majority answered" (1), "none did" (2), a
command line it cannot parse (64) and a configuration file or certificate it cannot use (78).

Before, two endpoints of a five-replica cluster, both answering, exited 0 ("the cluster can
serve") although three replicas were down; and a missing `--config` file exited 1, the status
a watching script reads as "some replicas are down"."""

from __future__ import annotations

import argparse
import pathlib
from typing import Any

import pytest

from cellar import ops_cli
from cellar.cli import main
from cellar.local_cluster import Layout
from tests.consensus.runtime.kv_node import kv_replica_node


def _answers(answering: int, listed: int, *, replica_count: int | None) -> list[dict[str, Any]]:
    """What `_statuses` finds: `listed` endpoints, the first `answering` of them up."""
    found: list[dict[str, Any]] = []
    for replica in range(listed):
        status: dict[str, Any] = {
            "endpoint": f"127.0.0.1:{7100 + replica}", "running": replica < answering,
            "replica_id": replica, "is_sequencer": replica == 0, "view": 0,
            "status": "normal", "sequencer": 0, "executed_slots": 5, "commit_prefix": 5}
        if replica_count is not None and replica < answering:
            status["replica_count"] = replica_count
        found.append(status)
    return found


@pytest.mark.parametrize(("answering", "listed", "replica_count", "exit_status"), [
    (2, 2, 5, 1),  # two of five listed, both up: three of five may be down
    (3, 3, 5, 0),
    (2, 5, 5, 1),
    (2, 3, None, 0),  # replicas that do not say their cluster's size: the endpoints listed
    (0, 2, None, 2),
])
def test_a_majority_is_of_the_cluster_the_replicas_report(
        monkeypatch: pytest.MonkeyPatch, answering: int, listed: int,
        replica_count: int | None, exit_status: int) -> None:
    async def statuses(args: argparse.Namespace) -> list[dict[str, Any]]:
        return _answers(answering, listed, replica_count=replica_count)

    monkeypatch.setattr(ops_cli, "_statuses", statuses)
    assert ops_cli.run_status(argparse.Namespace(json=False)) == exit_status


def test_the_same_replica_listed_twice_counts_once(monkeypatch: pytest.MonkeyPatch) -> None:
    async def statuses(args: argparse.Namespace) -> list[dict[str, Any]]:
        found = _answers(1, 3, replica_count=3)
        found[1] = {**found[0], "endpoint": "localhost:7100"}  # replica 0 again
        return found

    monkeypatch.setattr(ops_cli, "_statuses", statuses)
    assert ops_cli.run_status(argparse.Namespace(json=True)) == ops_cli.EXIT_NO_MAJORITY


def test_a_majority_is_of_the_configuration_files_peers(
        monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    layout = Layout(tmp_path / "cluster", 5, insecure=True, loop="asyncio", machine="kv")
    layout.write()

    async def statuses(args: argparse.Namespace) -> list[dict[str, Any]]:
        return _answers(2, 3, replica_count=None)  # an older build: no size reported

    monkeypatch.setattr(ops_cli, "_statuses", statuses)
    args = argparse.Namespace(json=True, config=layout.config_path(0))
    assert ops_cli.run_status(args) == ops_cli.EXIT_NO_MAJORITY
    assert ops_cli.cluster_size(_answers(2, 3, replica_count=None), configured=5) == 5
    assert ops_cli.cluster_size(_answers(2, 3, replica_count=7), configured=5) == 7


def test_a_replica_reports_its_clusters_size(tmp_path: pathlib.Path) -> None:
    layout = Layout(tmp_path / "cluster", 5, insecure=True, loop="asyncio", machine="kv")
    layout.write()
    with kv_replica_node(layout, 1) as node:
        assert node.status()["replica_count"] == 5


def test_a_configuration_file_it_cannot_read_is_not_a_minority(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["status", "--insecure", "--config", str(tmp_path / "replica.toml")])
    assert stopped.value.code == ops_cli.EXIT_CONFIG == 78
    assert capsys.readouterr().err == (f"cellar status: {tmp_path / 'replica.toml'}: cannot "
                                       f"read it (No such file or directory)\n")
    with pytest.raises(SystemExit) as stopped:
        main(["status", "--endpoints", "127.0.0.1:1", "--certs", str(tmp_path)])
    assert stopped.value.code == ops_cli.EXIT_CONFIG
    assert capsys.readouterr().err.startswith(f"cellar status: no {tmp_path / 'ca.pem'}: ")


def test_a_bad_command_line_is_not_no_replica_answering(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["status", "--insecure", "--endpoints", "nonsense"])
    assert stopped.value.code == ops_cli.EXIT_USAGE == 64
    with pytest.raises(SystemExit) as stopped:
        main(["status", "--insecure", "--endpoints", "127.0.0.1:1", "--bogus"])
    assert stopped.value.code == ops_cli.EXIT_USAGE
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_the_exit_statuses_are_documented() -> None:
    for status in (0, ops_cli.EXIT_NO_MAJORITY, ops_cli.EXIT_UNREACHABLE, ops_cli.EXIT_USAGE,
                   ops_cli.EXIT_CONFIG):
        assert f"  {status}  " in ops_cli.STATUS_EXIT_STATUSES
    readme = " ".join((pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
                      .split())
    assert "64 a command line it cannot parse" in readme
    assert "78 a configuration file or certificate it cannot use" in readme
