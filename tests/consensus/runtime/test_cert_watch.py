"""The certificate a long-running process presents, watched (`consensus.runtime.cert_watch`).

A replica or a node agent that started with months left crossed the last 30 days, and the
certificate's end, in silence: `TlsConfig.check` warns only at start, and peers log only INFO
lines as they refuse it. The watch logs a WARNING once at each of 30, 7 and 1 days left and an
ERROR once at the end; a renewed pair on disk is taken (`test_cert_reload.py`), and the lines
then judge it. Its clock is a fake one here: no test waits.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import pathlib
from typing import Any, cast

import anyio
import pytest

from agent.daemon import Agent
from agent.exporter import AgentView, render
from agent.gpu import GpuBackend
from cellar import ops_cli
from cellar.local_cluster import Layout
from consensus.runtime.cert_watch import CertWatch
from consensus.runtime.certs import CertificateAuthority
from consensus.runtime.config_fields import TlsFiles
from consensus.runtime.tls import Identity, IdentityRole, TlsConfig, TlsContexts
from statemachine.store import GpuStore
from tests.agent.agent_support import agent_config
from tests.consensus.runtime.kv_node import kv_replica_node

DAY = datetime.timedelta(days=1)
HOUR = datetime.timedelta(hours=1)
REPLICA = Identity.replica(0)


class FakeClock:
    def __init__(self) -> None:
        self.now = datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)

    def __call__(self) -> datetime.datetime:
        return self.now


@pytest.fixture
def authority() -> CertificateAuthority:
    return CertificateAuthority.create()


def write_pair(authority: CertificateAuthority, directory: pathlib.Path, *, days: int,
               identity: Identity = REPLICA) -> TlsConfig:
    """A certificate ending in `days`, over whatever pair `directory` held."""
    directory.mkdir(parents=True, exist_ok=True)
    issued = authority.issue(identity, days=days)
    (directory / "ca.pem").write_bytes(authority.certificate_pem)
    (directory / "cert.pem").write_bytes(issued.certificate_pem)
    (directory / "cert.key").write_bytes(issued.key_pem)
    return TlsConfig(ca_file=directory / "ca.pem", cert_file=directory / "cert.pem",
                     key_file=directory / "cert.key")


def said(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    """The watch's WARNING and ERROR lines since the last call."""
    found = [(record.levelno, record.getMessage()) for record in caplog.records
             if record.levelno >= logging.WARNING]
    caplog.clear()
    return found


def test_each_line_and_the_end_are_said_once(authority: CertificateAuthority,
                                            tmp_path: pathlib.Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    watch = CertWatch(TlsContexts(write_pair(authority, tmp_path, days=40)), "replica 0",
                      clock=clock)
    ends = watch.presented_ends
    caplog.set_level(logging.INFO, logger="cellar.transport")
    for left, expected in [
            (31 * DAY, []),
            (30 * DAY - HOUR, [(logging.WARNING, "in 29 day(s) (under 30)")]),
            (29 * DAY, []), (8 * DAY, []),
            (7 * DAY - HOUR, [(logging.WARNING, "in 6 day(s) (under 7)")]),
            (6 * DAY, []), (2 * DAY, []),
            (DAY - HOUR, [(logging.WARNING, "in 0 day(s) (under 1)")]),
            (HOUR, []),
            (-HOUR, [(logging.ERROR, "ended at")]),
            (-2 * HOUR, []), (-3 * DAY, [])]:
        clock.now = ends - left
        watch.look()
        lines = said(caplog)
        assert [level for level, _ in lines] == [level for level, _ in expected], (left, lines)
        for (_, line), (_, words) in zip(lines, expected, strict=True):
            assert line.startswith("replica 0: ") and words in line, line
            assert "cellar certs issue" in line, line
    assert watch.looks == 12


def test_a_start_past_two_lines_says_the_nearer_one_only(
        authority: CertificateAuthority, tmp_path: pathlib.Path,
        caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    watch = CertWatch(TlsContexts(write_pair(authority, tmp_path, days=40)), "node agent n0",
                      clock=clock)
    clock.now = watch.presented_ends - 5 * DAY
    caplog.set_level(logging.INFO, logger="cellar.transport")
    watch.look()
    watch.look()
    lines = said(caplog)
    assert len(lines) == 1 and "(under 7)" in lines[0][1], lines


def test_a_renewed_file_is_taken_and_the_lines_judge_it(
        authority: CertificateAuthority, tmp_path: pathlib.Path,
        caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    tls = write_pair(authority, tmp_path, days=40)
    watch = CertWatch(TlsContexts(tls), "replica 0", clock=clock)
    ends = watch.presented_ends
    caplog.set_level(logging.INFO, logger="cellar.transport")
    clock.now = ends - 6 * DAY
    watch.look()
    lines = said(caplog)
    assert len(lines) == 1 and "(under 7)" in lines[0][1], lines
    assert "without a restart" in lines[0][1] and "restart with" not in lines[0][1]
    write_pair(authority, tmp_path, days=365)  # renewed on disk, the process not restarted
    watch.look()
    renewed = watch.presented_ends
    assert renewed > ends + 300 * DAY and watch.contexts.taken == 1
    info = [record.getMessage() for record in caplog.records if record.levelno == logging.INFO]
    assert len(info) == 1 and "took the renewed" in info[0], info
    assert said(caplog) == []  # the new certificate is far from its lines
    assert watch.seconds_left() == (renewed - clock.now).total_seconds()
    status = watch.status()
    assert status["cert_expires_at"] == f"{renewed:%Y-%m-%dT%H:%M:%SZ}"
    assert "cert_files_refused" not in status
    clock.now = renewed - 20 * DAY
    watch.look()
    lines = said(caplog)
    assert len(lines) == 1 and "(under 30)" in lines[0][1], lines


def test_a_file_that_cannot_be_read_is_said_once(authority: CertificateAuthority,
                                                 tmp_path: pathlib.Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    tls = write_pair(authority, tmp_path, days=400)
    watch = CertWatch(TlsContexts(tls), "replica 0", clock=clock)
    clock.now = watch.presented_ends - 100 * DAY
    caplog.set_level(logging.INFO, logger="cellar.transport")
    watch.look()
    assert said(caplog) == []
    tls.cert_file.unlink()
    watch.look()
    watch.look()
    lines = said(caplog)
    assert len(lines) == 1 and "cannot be read" in lines[0][1], lines
    assert str(tls.cert_file) in lines[0][1]
    assert watch.seconds_left() == 100 * DAY.total_seconds()  # it still presents the old one
    assert "cannot be read" in watch.status()["cert_files_refused"]


@pytest.mark.anyio
async def test_the_task_looks_every_period(authority: CertificateAuthority,
                                           tmp_path: pathlib.Path) -> None:
    clock = FakeClock()
    watch = CertWatch(TlsContexts(write_pair(authority, tmp_path, days=40)), "replica 0",
                      clock=clock, period_s=0.001)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(watch.run)
            while watch.looks < 3:
                await anyio.sleep(0.001)
            tasks.cancel_scope.cancel()
    with pytest.raises(ValueError, match="period_s"):
        CertWatch(watch.contexts, "replica 0", period_s=0)


def test_a_replica_under_tls_carries_its_certificates_end(tmp_path: pathlib.Path) -> None:
    layout = Layout(tmp_path / "cluster", 3, loop="asyncio", machine="kv")
    layout.write()
    with kv_replica_node(layout, 1) as node:
        status = node.status()
        page = node.render_metrics()
    assert node.cert_watch is not None
    ends = node.cert_watch.presented_ends
    assert status["cert_expires_at"] == f"{ends:%Y-%m-%dT%H:%M:%SZ}"
    assert status["cert_days_left"] in (363, 364, 365)  # cellar certs init: 365 days
    assert "cert_renewed_expires_at" not in status
    gauge = [line for line in page.splitlines()
             if line.startswith("cellar_tls_cert_seconds_left ")]
    assert len(gauge) == 1 and 363 * 86400 < int(gauge[0].split()[1]) <= 365 * 86400
    assert "# TYPE cellar_tls_cert_seconds_left gauge" in page


def test_a_plain_tcp_replica_carries_none(tmp_path: pathlib.Path) -> None:
    layout = Layout(tmp_path / "cluster", 3, insecure=True, loop="asyncio", machine="kv")
    layout.write()
    with kv_replica_node(layout, 0) as node:
        assert node.cert_watch is None
        assert not any(key.startswith("cert_") for key in node.status())
        assert "tls_cert" not in node.render_metrics()


def _answer(replica: int, **cert: Any) -> dict[str, Any]:
    return {"endpoint": f"127.0.0.1:{7100 + replica}", "running": True, "replica_id": replica,
            "is_sequencer": replica == 0, "view": 0, "status": "normal", "sequencer": 0,
            "executed_slots": 5, "commit_prefix": 5, "peers_connected": [], "replica_count": 5,
            **cert}


def test_the_table_shows_days_left_and_flags_a_near_end() -> None:
    statuses = [
        _answer(0, cert_expires_at="2027-11-01T00:00:00Z", cert_days_left=300),
        _answer(1, cert_expires_at="2026-12-20T10:00:00Z", cert_days_left=12),
        _answer(2, cert_expires_at="2026-11-01T10:00:00Z", cert_days_left=-3,
                cert_renewed_expires_at="2027-11-01T00:00:00Z"),  # a build before renewals
        _answer(3, cert_expires_at="2026-12-10T10:00:00Z", cert_days_left=2,
                cert_files_refused="certs/replica-3.key is not the key of the certificate"),
        _answer(4)]  # plain TCP, or a build that does not say
    lines = ops_cli.status_table(statuses)
    assert lines[0].endswith(" peers    cert")
    assert lines[1].endswith(" 300d") and len(lines[1]) == len(lines[0])
    assert lines[2].endswith(" 12d!")
    assert lines[3] == ("        certificate: ends at 2026-12-20T10:00:00Z, in 12 day(s); "
                        "issue a new one (`cellar certs issue`) into its place: the replica "
                        "takes it within the hour, without a restart")
    assert lines[4].endswith(" expired")
    assert lines[5] == ("        certificate: ended at 2026-11-01T10:00:00Z: no peer accepts "
                        "it; a renewed one (ends 2027-11-01T00:00:00Z) is on disk: restart "
                        "the replica")
    assert lines[6].endswith(" 2d!")
    assert lines[7] == ("        certificate: ends at 2026-12-10T10:00:00Z, in 2 day(s); the "
                        "files on disk are refused (certs/replica-3.key is not the key of the "
                        "certificate): put a valid pair in their place (taken within the "
                        "hour, no restart)")
    assert lines[8].endswith(" -") and len(lines) == 9


def test_the_json_carries_it(monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    async def statuses(args: argparse.Namespace) -> list[dict[str, Any]]:
        return [_answer(replica, cert_expires_at="2026-12-20T10:00:00Z", cert_days_left=12)
                for replica in range(3)]

    monkeypatch.setattr(ops_cli, "_statuses", statuses)
    assert ops_cli.run_status(argparse.Namespace(json=True)) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [(replica["cert_expires_at"], replica["cert_days_left"])
            for replica in printed["replicas"]] == [("2026-12-20T10:00:00Z", 12)] * 3


def test_a_node_agent_under_tls_watches_and_exports_it(authority: CertificateAuthority,
                                                       tmp_path: pathlib.Path) -> None:
    tls = write_pair(authority, tmp_path / "certs", days=20,
                     identity=Identity(IdentityRole.NODE, "n0"))
    config = agent_config("n0", tmp_path / "state", insecure=False,
                          tls=TlsFiles(ca=tls.ca_file, cert=tls.cert_file, key=tls.key_file))
    agent = Agent(config, cast(GpuBackend, None), cast(GpuStore, None))
    assert agent.cert_watch is not None and agent.cert_watch.tls.cert_file == tls.cert_file
    assert agent.cert_watch.what == "node agent n0"
    plain = Agent(agent_config("n0", tmp_path / "plain"), cast(GpuBackend, None),
                  cast(GpuStore, None))
    assert plain.cert_watch is None
    page = render(AgentView(node="n0", cert_seconds_left=1_700_000.0))
    assert "# TYPE gpu_agent_tls_cert_seconds_left gauge" in page
    assert "\ngpu_agent_tls_cert_seconds_left 1700000\n" in page
    assert "tls_cert" not in render(AgentView(node="n0"))
