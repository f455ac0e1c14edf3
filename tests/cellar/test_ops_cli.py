"""The operator commands against a live cluster: status, apply-config, cordon, queries; their
documented exit statuses and one-line errors when nothing answers or an argument or file is bad;
and the configuration file reader's errors."""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from cellar import ops_cli
from cellar.cli import main
from cellar.local_cluster import Layout, ProcessCluster, free_ports
from cellar.spec_file import SpecFileError, load_spec
from consensus.runtime.client import (
    ClientError,
    Forbidden,
    OutcomeUnknown,
    Rejected,
    ReplyTooLarge,
    Unavailable,
)
from statemachine.groups import Group
from statemachine.limits import QUERY_LIMIT_MAX
from statemachine.machine import Machine
from statemachine.nodes import NodeRecord

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "cluster.toml"


def test_the_example_configuration_loads() -> None:
    spec = load_spec(EXAMPLE)
    assert [cell.nodes for cell in spec.physical_cells] == [("node-00", "node-01"),
                                                          ("node-02", "node-03")]
    assert spec.virtual_clusters[1].quota == ()


@pytest.mark.parametrize(("text", "message"), [
    ("gpu_models = 3", "spec.gpu_models"),
    ("physical_cells = []\n[[gpu_models]]\nname = 'A100'",
     r"spec\.gpu_models\[0\]\.memory_mib: missing"),
    ("gpu_models = []\ncell_types = []", "spec.physical_cells: missing"),
    ("gpu_models = = 1", "not valid TOML"),
    # not lists: iterating them to fill in defaults raised TypeError
    ("gpu_models = []\ncell_types = 3", "spec.cell_types: expected a list"),
    ("gpu_models = []\nphysical_cells = []\nvirtual_clusters = true",
     "spec.virtual_clusters: expected a list"),
])
def test_bad_configuration_files_name_the_path(tmp_path: pathlib.Path, text: str,
                                               message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(SpecFileError, match=message):
        load_spec(path)


def test_a_file_nested_too_deep_is_refused_by_name(tmp_path: pathlib.Path) -> None:
    """The parsers recurse: such a file raised RecursionError, not SpecFileError."""
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(SpecFileError, match="not valid JSON"):
        load_spec(path)


def nothing_listening() -> list[str]:
    """Plain-TCP connection options for a loopback port nothing listens on."""
    return ["--insecure", "--endpoints", f"127.0.0.1:{free_ports(1)[0]}", "--timeout", "1"]


def test_admin_with_no_replica_answering_exits_2_with_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The client's error reaches `cellar admin` through its task group: not as a group."""
    assert main(["admin", *nothing_listening(), "nodes"]) == 2
    last_line = capsys.readouterr().err.splitlines()[-1]
    # with why connecting failed (nothing listening here; elsewhere a TLS handshake refused)
    assert last_line.startswith("cellar admin: no replica answered the read in time "
                                "(connecting: ")


def test_admin_apply_config_names_a_missing_file_and_exits_1(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.toml"
    assert main(["admin", *nothing_listening(), "apply-config", str(missing)]) == 1
    assert capsys.readouterr().err.endswith(f"cellar admin: {missing}: cannot read it (No such "
                                            "file or directory)\n")


def test_status_with_no_replica_answering_shows_it_down_and_exits_2(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", *nothing_listening()]) == 2
    assert "down" in capsys.readouterr().out.splitlines()[1]


@pytest.mark.parametrize(("answering", "status"), [(3, 0), (2, 0), (1, 1), (0, 2)])
def test_status_exits_0_only_when_a_majority_answers(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], answering: int,
        status: int) -> None:
    """A script watching the cluster's health reads the status: 1 replica of 3 up cannot
    serve (it exited 0 while any one answered)."""
    async def statuses(args: argparse.Namespace) -> list[dict[str, object]]:
        return [{"endpoint": f"127.0.0.1:{7100 + replica}", "running": replica < answering,
                 "replica_id": replica, "is_sequencer": replica == 0, "view": 0,
                 "status": "normal", "sequencer": 0, "executed_slots": 5, "commit_prefix": 5}
                for replica in range(3)]

    monkeypatch.setattr(ops_cli, "_statuses", statuses)
    assert ops_cli.run_status(argparse.Namespace(json=True)) == status
    assert len(json.loads(capsys.readouterr().out)["replicas"]) == 3


def test_status_names_the_peers_a_replica_refuses_and_why() -> None:
    status = {"endpoint": "127.0.0.1:7100", "running": True, "replica_id": 0,
              "is_sequencer": True, "view": 0, "status": "normal", "sequencer": 0,
              "executed_slots": 5, "commit_prefix": 5, "peers_connected": [2],
              "peers_refused": {"1": "its lease timing differs: tick_ms 5 there, 10 here"}}
    lines = ops_cli.status_table([status])
    assert lines[2] == ("        refuses replica 1: its lease timing differs: tick_ms 5 there, "
                        "10 here")


def test_status_says_where_a_rejoin_stands() -> None:
    status = {"endpoint": "127.0.0.1:7101", "running": True, "replica_id": 1,
              "is_sequencer": False, "view": 0, "status": "awaiting", "sequencer": 0,
              "executed_slots": 0, "commit_prefix": 0, "peers_connected": [0, 2],
              "rejoin": "lost its data directory: ... no report yet from replicas 2"}
    lines = ops_cli.status_table([status])
    assert lines[2] == "        rejoin: lost its data directory: ... no report yet from replicas 2"


def test_status_says_a_clock_off_from_its_group_and_not_one_yet_unheard() -> None:
    status = {"endpoint": "127.0.0.1:7100", "running": True, "replica_id": 0,
              "is_sequencer": True, "view": 0, "status": "normal", "sequencer": 0,
              "executed_slots": 5, "commit_prefix": 5, "peers_connected": [1, 2],
              "clock_agrees": False, "clock_offsets_ms": {"2": -3600000, "1": -3599990}}
    lines = ops_cli.status_table([status])
    assert lines[2] == ("        clock: not within 1 s of a majority (peers' offsets: replica 1 "
                        "-3599990 ms, replica 2 -3600000 ms); no Ticks while sequencer: fix "
                        "its time, restart it")
    booting = {**status, "clock_offsets_ms": {}}  # no peer heard yet: nothing to say
    agreeing = {**status, "clock_agrees": True}
    assert len(ops_cli.status_table([booting])) == len(ops_cli.status_table([agreeing])) == 2


@pytest.mark.parametrize(("argv", "message"), [
    (["status", "--insecure", "--endpoints", "nonsense"],
     "argument --endpoints: 'nonsense' is not HOST:PORT"),
    (["status", "--insecure", "--endpoints", "127.0.0.1:7100,host"],
     "argument --endpoints: 'host' is not HOST:PORT"),
    (["admin", "--endpoints", "127.0.0.1:7100", "--as", "root:alice", "nodes"],
     "argument --as: 'root:alice' is not ROLE:NAME"),
])
def test_a_malformed_endpoint_or_identity_is_a_usage_error(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == (64 if argv[0] == "status" else 2)  # status: 2 is "none up"
    error = capsys.readouterr().err
    assert message in error and "Traceback" not in error


def test_an_unreadable_config_or_missing_certificate_ends_with_one_line(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["status", "--insecure", "--config", str(tmp_path / "replica.toml")])
    assert stopped.value.code == ops_cli.EXIT_CONFIG
    assert capsys.readouterr().err == f"cellar status: {tmp_path / 'replica.toml'}: cannot " \
                                      "read it (No such file or directory)\n"
    with pytest.raises(SystemExit) as stopped:
        main(["admin", "--endpoints", "127.0.0.1:7100", "--certs", str(tmp_path), "nodes"])
    assert str(stopped.value.code).startswith(f"cellar admin: no {tmp_path / 'ca.pem'}: ")


@pytest.mark.live
def test_status_and_admin_against_a_live_cluster(tmp_path: pathlib.Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    layout = Layout(tmp_path / "cluster", 3, loop="asyncio")
    layout.write(admins=["root"])
    cluster = ProcessCluster(layout)
    cluster.start()
    try:
        cluster.wait_ports()
        connection = ["--config", str(layout.config_path(0)), "--certs", str(layout.certs),
                      "--as", "admin:root"]
        assert main(["admin", *connection, "apply-config", str(EXAMPLE)]) == 0
        assert json.loads(capsys.readouterr().out)["version"] == 1
        assert main(["admin", *connection, "apply-config", str(EXAMPLE)]) == 1
        assert "version_mismatch" in capsys.readouterr().out
        assert main(["admin", *connection, "cordon", "node-01"]) == 0
        capsys.readouterr()
        assert main(["admin", *connection, "stats"]) == 0
        assert json.loads(capsys.readouterr().out)["gpus"] == 32
        for _ in range(10):  # a replica too busy to answer in time is listed as down
            assert main(["status", *connection, "--json"]) == 0
            replicas = json.loads(capsys.readouterr().out)["replicas"]
            if all(replica["running"] for replica in replicas):
                break
        assert sum(replica["is_sequencer"] for replica in replicas) == 1
        cluster.processes[1].kill()
        assert main(["status", *connection]) == 0
        table = capsys.readouterr().out.splitlines()
        assert len(table) == 5 and sum("down" in line for line in table) == 1
        assert table[-1] == "2 of 3 replicas answered"  # of the cluster's 3, not those listed
    finally:
        cluster.stop()


@pytest.mark.parametrize("action", ["nodes", "gangs"])
def test_cellar_admin_lists_every_node_and_gang_not_only_the_first_page(
        action: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A cluster may hold NODES_MAX (16,384) nodes and GROUPS_MAX gangs; one query's page
    holds QUERY_LIMIT_MAX (4,096), and the rest were left out with nothing said."""
    machine = Machine()
    count = QUERY_LIMIT_MAX + 10
    machine.state.nodes = {f"n{index:05d}": NodeRecord(node=f"n{index:05d}", index=index)
                           for index in range(count)}
    machine.state.groups = {f"g{index:05d}": Group(
        group=f"g{index:05d}", vc="a", priority=0, lazy_preemption=False, gpu_model="",
        members=(), submit_index=index, submitted_ms=0, pods=()) for index in range(count)}

    class Client:
        async def read(self, query: bytes, **_: Any) -> bytes:
            return machine.query(query)

    @contextlib.asynccontextmanager
    async def answered_here(args: Any) -> AsyncIterator[Client]:
        yield Client()

    monkeypatch.setattr(ops_cli, "client_from", answered_here)
    assert main(["admin", "--insecure", "--endpoints", "127.0.0.1:1", action]) == 0
    listed = json.loads(capsys.readouterr().out)["nodes" if action == "nodes" else "groups"]
    assert len(listed) == count


@pytest.mark.parametrize(("error", "status", "says"), [
    (Unavailable("no replica took the command within 1.0 s"), 2, "cellar admin: no replica"),
    (OutcomeUnknown("no result within 1.0 s"), 3,
     "cellar admin: outcome unknown, it may have been applied: no result"),
    (Forbidden("not yours"), 4, "cellar admin: forbidden: not yours"),
    (Rejected("malformed"), 5, "cellar admin: refused by the replica: malformed"),
    (ReplyTooLarge("over the cap"), 3, "cellar admin: outcome unknown, it ran"),
])
def test_admin_exits_with_a_status_of_its_own_for_each_client_error(
        error: ClientError, status: int, says: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Every client error exited 2, "no replica could be reached", OutcomeUnknown too: an
    operator or script would take a command that may have been applied for one that was not."""

    class Client:
        async def propose(self, body: bytes, **_: Any) -> bytes:
            raise error

    @contextlib.asynccontextmanager
    async def failing(args: Any) -> AsyncIterator[Client]:
        yield Client()

    monkeypatch.setattr(ops_cli, "client_from", failing)
    assert main(["admin", "--insecure", "--endpoints", "127.0.0.1:1", "cordon", "n0"]) == status
    assert capsys.readouterr().err.startswith(says)
    assert f"  {status}  " in ops_cli.ADMIN_EXIT_STATUSES


def test_a_query_whose_answer_is_too_large_is_refused_not_unknown(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A query changes nothing: its answer too large is a refusal (5), while a command's is an
    unknown outcome (3: it ran, applied or rejected, and running it again may apply it twice)."""

    class Client:
        async def read(self, query: bytes, **_: Any) -> bytes:
            raise ReplyTooLarge("over the cap")

    @contextlib.asynccontextmanager
    async def failing(args: Any) -> AsyncIterator[Client]:
        yield Client()

    monkeypatch.setattr(ops_cli, "client_from", failing)
    assert main(["admin", "--insecure", "--endpoints", "127.0.0.1:1", "stats"]) == 5
    assert capsys.readouterr().err.startswith("cellar admin: refused by the replica")
