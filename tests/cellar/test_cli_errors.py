"""Wrong input to the command line ends in a short error and a documented non-zero status,
never a traceback or a silent success."""

from __future__ import annotations

import contextlib
import pathlib
import socket
import tomllib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from cellar import agent_cli, ops_cli
from cellar.cli import main
from cellar.daemon_process import EXIT_CONFIG, EXIT_UNAVAILABLE
from consensus.runtime.certs import CA_DAYS
from consensus.runtime.node_config import NodeConfigError, parse_node_config
from statemachine.errors import Code, Rejection
from statemachine.result_codec import encode_result
from tests.consensus.runtime.test_node_config import THREE_PEERS

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "cluster.toml"


# --- addresses -------------------------------------------------------------------------------

@pytest.mark.parametrize("command", [["status"], ["admin", "--timeout", "1"]])
@pytest.mark.parametrize("endpoint", ["127.0.0.1:99999", "127.0.0.1:0", "127.0.0.1:65536"])
def test_an_endpoint_port_out_of_range_is_a_usage_error(
        command: list[str], endpoint: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`--endpoints 127.0.0.1:99999` passed the check and ended in an OverflowError traceback
    from deep in asyncio's connect (port must be 0-65535)."""
    argv = [*command, "--insecure", "--endpoints", endpoint]
    if command[0] == "admin":
        argv.append("stats")
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == (64 if command[0] == "status" else 2)  # status: 2 is "none up"
    assert "argument --endpoints" in capsys.readouterr().err


# --- cellar admin ----------------------------------------------------------------------------

def test_an_expected_version_past_64_bits_is_a_usage_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    """`--expected-version 10**30` raised OverflowError out of msgpack: a traceback."""
    with pytest.raises(SystemExit) as exited:
        main(["admin", "--insecure", "--endpoints", "127.0.0.1:1", "--timeout", "1",
              "apply-config", str(EXAMPLE), "--expected-version", str(10**30)])
    assert exited.value.code == 2
    assert "--expected-version" in capsys.readouterr().err


def test_gangs_with_an_unknown_phase_is_refused_not_an_empty_list(
        capsys: pytest.CaptureFixture[str]) -> None:
    """`cellar admin gangs --phase runing` (a typo) listed no gangs and exited 0."""
    with pytest.raises(SystemExit) as exited:
        main(["admin", "--insecure", "--endpoints", "127.0.0.1:1", "gangs", "--phase", "runing"])
    assert exited.value.code == 2
    assert "--phase" in capsys.readouterr().err


def test_a_command_this_identity_may_not_send_exits_4(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """ADMIN_EXIT_STATUSES: "4 forbidden: this identity may not issue that command". A command
    the state machine refuses as unauthorized (`--as node:n1 cordon n0`) exited 1 instead."""
    answer = encode_result(Rejection(code=Code.UNAUTHORIZED, message="node:n1 may not send Cordon"))

    class Client:
        async def propose(self, body: bytes, **_: Any) -> bytes:
            return answer

    @contextlib.asynccontextmanager
    async def answering(args: Any) -> AsyncIterator[Client]:
        yield Client()

    monkeypatch.setattr(ops_cli, "client_from", answering)
    assert main(["admin", "--insecure", "--endpoints", "127.0.0.1:1", "cordon", "n0"]) == 4
    assert "may not send Cordon" in capsys.readouterr().err


def test_missing_certs_names_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    """Every other error of `cellar status` starts `cellar status:`; this one did not."""
    with pytest.raises(SystemExit) as exited:
        main(["status", "--endpoints", "127.0.0.1:1"])
    assert exited.value.code == ops_cli.EXIT_CONFIG
    assert capsys.readouterr().err.startswith("cellar status: --certs DIR is needed")


# --- replica configuration -------------------------------------------------------------------

BASE = """
replica_id = 0
data_dir = "data-0"
insecure = true
""" + THREE_PEERS


def test_a_key_written_after_the_peers_tables_is_refused_not_dropped() -> None:
    """TOML puts `sync = false` written at the end of the file into the last [[peers]] table,
    where it was silently ignored: the replica ran synced, with no word said."""
    with pytest.raises(NodeConfigError, match=r"peers\[2\]\.sync"):
        parse_node_config(tomllib.loads(BASE + "sync = false\n"), base=pathlib.Path("."))


def test_an_unknown_key_in_tls_is_refused(tmp_path: pathlib.Path) -> None:
    for name in ("ca.pem", "r.pem", "r.key"):
        (tmp_path / name).write_text("x")
    text = BASE.replace("insecure = true\n", "") + (
        '[tls]\nca = "ca.pem"\ncert = "r.pem"\nkey = "r.key"\nmetrics = "127.0.0.1:9400"\n')
    with pytest.raises(NodeConfigError, match=r"tls\.metrics"):
        parse_node_config(tomllib.loads(text), base=tmp_path)


# --- cellar certs ----------------------------------------------------------------------------

def test_certs_with_too_many_days_is_a_usage_error_and_writes_nothing(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--days 99999999` raised OverflowError (date value out of range) after writing the CA,
    so the next `cellar certs init` with sane days was refused: ca.pem exists."""
    directory = tmp_path / "certs"
    with pytest.raises(SystemExit) as exited:
        main(["certs", "init", str(directory), "--days", "99999999"])
    assert exited.value.code == 2
    assert "--days" in capsys.readouterr().err
    assert not directory.exists()


def test_the_days_cap_is_the_ca_s_validity() -> None:
    from consensus.runtime.certs_cli import DAYS_MAX  # noqa: PLC0415 - added by the fix

    assert DAYS_MAX == CA_DAYS


# --- cellar bench checker --------------------------------------------------------------------

@pytest.mark.parametrize("content", [None, "garbage\n"])
def test_bench_checker_with_a_bad_file_says_so_in_one_line(
        tmp_path: pathlib.Path, content: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    """A missing or unreadable --files history ended in a traceback."""
    path = tmp_path / "history.jsonl"
    if content is not None:
        path.write_text(content)
    assert main(["bench", "checker", "--runs", "1", "--files", str(path)]) == 3
    error = capsys.readouterr().err
    assert error.startswith("cellar bench checker: ")
    assert "Traceback" not in error and error.count("\n") == 1


def test_bench_checker_with_an_unknown_model_says_so(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "history.jsonl"
    path.write_text("")
    assert main(["bench", "checker", "--runs", "1", "--files", str(path),
                 "--model", "bogus"]) == 3
    assert "no model named 'bogus'" in capsys.readouterr().err


# --- cellar agent ----------------------------------------------------------------------------

def agent_file(tmp_path: pathlib.Path, extra: str) -> pathlib.Path:
    path = tmp_path / "agent.toml"
    path.write_text('node = "n1"\nstore = ["127.0.0.1:1"]\ninsecure = true\n'
                    f'backend = "fake:a100-8"\nloop = "asyncio"\n{extra}')
    return path


def test_an_agent_state_dir_that_cannot_be_made_is_refused_in_one_line(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A state_dir under a file ended in a NotADirectoryError traceback, exit 1."""
    monkeypatch.setattr(agent_cli, "start_logging", lambda args: None)
    (tmp_path / "file").write_text("")
    path = agent_file(tmp_path, f'state_dir = "{tmp_path / "file" / "state"}"\n')
    assert main(["agent", "--config", str(path)]) == EXIT_CONFIG
    error = capsys.readouterr().err
    assert error.startswith("cellar agent: state_dir: ") and "Traceback" not in error


def test_an_agent_metrics_port_in_use_exits_69_like_a_replica(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A metrics address in use ended in a CannotListen traceback, exit 1 (a replica: 69)."""
    monkeypatch.setattr(agent_cli, "start_logging", lambda args: None)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        path = agent_file(tmp_path, f'state_dir = "{tmp_path / "state"}"\n'
                                    f'metrics = "127.0.0.1:{port}"\n')
        assert main(["agent", "--config", str(path)]) == EXIT_UNAVAILABLE
    error = capsys.readouterr().err
    assert error == f"cellar agent: cannot listen on 127.0.0.1:{port} (Address already in use)\n"


# --- bench directories -----------------------------------------------------------------------

@pytest.mark.parametrize("benchmark", ["cluster", "agent", "storage"])
def test_a_bench_dir_that_is_not_a_directory_is_a_usage_error(
        benchmark: str, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`cellar bench cluster --dir /no/such` ended in a FileNotFoundError traceback."""
    with pytest.raises(SystemExit) as exited:
        main(["bench", benchmark, "--runs", "1", "--dir", str(tmp_path / "none")])
    assert exited.value.code == 2
    assert "argument --dir" in capsys.readouterr().err


def test_bench_peers_refuses_an_out_it_cannot_write_before_measuring(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--out` was first written after every round (about 25 minutes): a path under a file
    then ended in a traceback and the measurements were lost."""
    from cellar.bench.peers import suite  # noqa: PLC0415

    def prepare(*args: Any) -> Any:
        raise AssertionError("a round started")

    monkeypatch.setattr(suite, "prepare", prepare)
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as exited:
        main(["bench", "peers", "--no-install", "--systems", "cellar-3", "--rounds", "1",
              "--work-dir", str(tmp_path / "work"), "--out", str(tmp_path / "file" / "out")])
    assert str(exited.value.code).startswith("cellar bench peers: --out ")


def test_a_data_dir_under_a_file_is_not_blamed_on_the_disk(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`data_dir` below a regular file (a typo in the path) told the operator to check the disk
    with dmesg and SMART."""
    from cellar import replica_cli  # noqa: PLC0415

    monkeypatch.setattr(replica_cli, "start_logging", lambda args: None)
    (tmp_path / "file").write_text("")
    config = tmp_path / "replica.toml"
    config.write_text(BASE.replace('"data-0"', '"file/data-0"'))
    assert main(["replica", "--config", str(config), "--init"]) != 0
    error = capsys.readouterr().err
    assert "dmesg" not in error and "data_dir" in error


def test_status_config_needs_only_the_peers_addresses(
        tmp_path: pathlib.Path) -> None:
    """`cellar status --config replica-0.toml` read the whole replica file and refused it
    where the replica's own certificate and key were not (an administrator's machine:
    `tls.cert: certs/replica-0.pem does not exist`), though it uses only the client addresses."""
    from cellar.local_cluster import free_ports  # noqa: PLC0415

    ports = free_ports(3)
    text = BASE.replace("insecure = true\n", '[tls]\nca = "certs/ca.pem"\n'
                        'cert = "certs/replica-0.pem"\nkey = "certs/replica-0.key"\n')
    for index, port in enumerate(ports):
        text = text.replace(f"127.0.0.1:710{index}", f"127.0.0.1:{port}")
    config = tmp_path / "replica-0.toml"
    config.write_text(text)
    assert main(["status", "--config", str(config), "--insecure", "--timeout", "1"]) == 2


def test_a_refused_certs_init_leaves_no_ca_behind(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`cellar certs init DIR` where DIR held replica-0.pem wrote a new CA, then refused
    (replica-0.pem exists): the retry after moving that file away was refused too (ca.pem
    exists), and the CA left there signed none of the certificates beside it."""
    directory = tmp_path / "certs"
    directory.mkdir()
    (directory / "replica-0.pem").write_text("")
    assert main(["certs", "init", str(directory)]) == 1
    assert "replica-0.pem exists" in capsys.readouterr().err
    assert sorted(path.name for path in directory.iterdir()) == ["replica-0.pem"]


@pytest.mark.parametrize(("old", "new", "says"), [
    ("127.0.0.1:7101", "127.0.0.1:7100", r"peers\[1\]\.client: 127\.0\.0\.1:7100 is also "
                                         r"peers\[0\]\.client"),
    ('client = "127.0.0.1:7100"', 'client = "127.0.0.1:7000"',
     r"peers\[0\]\.client: 127\.0\.0\.1:7000 is also peers\[0\]\.peer"),
])
def test_an_address_named_twice_is_refused_by_key(old: str, new: str, says: str) -> None:
    """A replica whose peer and client addresses were the same started, opened (with --init,
    created) its data directory, then exited 69 "Address already in use" with nothing else
    on that port; the README promises such a file is refused first, naming the key (78)."""
    with pytest.raises(NodeConfigError, match=says):
        parse_node_config(tomllib.loads(BASE.replace(old, new)), base=pathlib.Path("."))


def test_a_metrics_address_that_is_a_peer_s_is_refused_by_key() -> None:
    text = 'metrics = "127.0.0.1:7100"\n' + BASE
    with pytest.raises(NodeConfigError, match=r"metrics: 127\.0\.0\.1:7100 is also"):
        parse_node_config(tomllib.loads(text), base=pathlib.Path("."))
