"""A renewed certificate taken while the process runs (`cert_watch.py`, `TlsContexts`).

A replica, a client and a node agent built their contexts once, at start: a renewed pair on
disk was presented only after a restart, and the watch said "restart to present it". Now the
watch's look takes a changed pair that a peer would accept into the contexts every listener and
dialer of the process shares, for every new handshake, and refuses (once, naming the file and
why) one that no peer would, keeping the old one in use.

Everything runs on loopback; the watch's `look` is called directly (no period is waited for),
and every wait is under `fail_after`.
"""

from __future__ import annotations

import datetime
import logging
import pathlib
from collections.abc import Callable
from typing import cast

import anyio
import anyio.abc
import pytest
from anyio.streams.tls import TLSAttribute
from cryptography import x509

from agent.daemon import Agent
from agent.gpu import GpuBackend
from cellar.local_cluster import Layout
from consensus.runtime.cert_watch import CertWatch
from consensus.runtime.certs import CertificateAuthority
from consensus.runtime.config_fields import TlsFiles
from consensus.runtime.connect import connector
from consensus.runtime.framing import FramedConnection, Metrics
from consensus.runtime.listener import ClientListener
from consensus.runtime.tls import Identity, IdentityRole, TlsConfig, TlsContexts, tls_handshake
from statemachine.store import GpuStore
from tests.agent.agent_support import agent_config
from tests.consensus.runtime.kv_node import kv_replica_node

pytestmark = pytest.mark.anyio
HOST = "127.0.0.1"
DAY = datetime.timedelta(days=1)
REPLICA = Identity.replica(0)
ADMIN = Identity(IdentityRole.ADMIN, "admin")
NODE = Identity(IdentityRole.NODE, "n0")
WAIT_S = 20


def write_pair(authority: CertificateAuthority, tls: TlsConfig, identity: Identity, *,
               days: int) -> int:
    """A pair for `identity` ending in `days`, written over `tls`'s files; its serial."""
    issued = authority.issue(identity, hosts=("127.0.0.1",), days=days)
    tls.cert_file.write_bytes(issued.certificate_pem)
    tls.key_file.write_bytes(issued.key_pem)
    return x509.load_pem_x509_certificate(issued.certificate_pem).serial_number


def files_in(directory: pathlib.Path, stem: str, authority: CertificateAuthority,
             ) -> TlsConfig:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "ca.pem").write_bytes(authority.certificate_pem)
    return TlsConfig(ca_file=directory / "ca.pem", cert_file=directory / f"{stem}.pem",
                     key_file=directory / f"{stem}.key")


async def served_serial(address: tuple[str, int], client: TlsConfig) -> int:
    """Dial `address` as `client` and say the serial of the certificate the server offers."""
    with anyio.fail_after(WAIT_S):
        stream = await anyio.connect_tcp(*address)
        accepted = await tls_handshake(stream, client.client_context(), server_side=False,
                                       metrics=Metrics())
        assert accepted is not None, "the handshake failed"
        tls_stream, identity = accepted
        assert identity.role is IdentityRole.REPLICA
        der = tls_stream.extra(TLSAttribute.peer_certificate_binary)
        await anyio.aclose_forcefully(tls_stream)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno == level]


async def test_a_replica_offers_a_renewed_certificate_to_new_connections(
        tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    layout = Layout(tmp_path / "cluster", 3, loop="asyncio", machine="kv")
    layout.write()
    authority = CertificateAuthority.load(layout.certs)
    served = TlsConfig.in_directory(layout.certs, REPLICA)
    ending_soon = write_pair(authority, served, REPLICA, days=3)  # A
    admin = TlsConfig.in_directory(layout.certs, ADMIN)
    peer = TlsConfig.in_directory(layout.certs, Identity.replica(1))
    caplog.set_level(logging.INFO, logger="cellar.transport")
    with kv_replica_node(layout, 0) as node:
        watch = node.cert_watch
        assert watch is not None
        with anyio.fail_after(WAIT_S):
            async with anyio.create_task_group() as tasks:
                await tasks.start(node.run)
                clients, peers = node.listener.address, node.mesh.address
                assert clients is not None and peers is not None
                assert await served_serial(clients, admin) == ending_soon
                assert await served_serial(peers, peer) == ending_soon
                watch.look()  # nothing changed: nothing taken
                assert await served_serial(clients, admin) == ending_soon
                renewed = write_pair(authority, served, REPLICA, days=365)  # B
                watch.look()
                # Without the fix: both still offer A until a restart.
                assert await served_serial(clients, admin) == renewed
                assert await served_serial(peers, peer) == renewed
                tasks.cancel_scope.cancel()
        status = node.status()
        page = node.render_metrics()
    assert status["cert_days_left"] in (363, 364, 365)
    assert "cert_files_refused" not in status
    gauge = [line for line in page.splitlines()
             if line.startswith("cellar_tls_cert_seconds_left ")]
    assert len(gauge) == 1 and int(gauge[0].split()[1]) > 300 * 86400
    taken = [line for line in lines(caplog, logging.INFO) if "took the renewed" in line]
    assert len(taken) == 1 and f"serial {renewed:x}" in taken[0], taken
    advised = lines(caplog, logging.WARNING)
    assert any("without a restart" in line for line in advised), advised  # the 7-day line
    assert not any("restart to" in line or "restart with" in line for line in advised)


class Server:
    """A client listener built as a replica builds it, with its watch; it records the serial
    of each client certificate it is shown."""

    def __init__(self, tls: TlsConfig, clock: Callable[[], datetime.datetime]) -> None:
        self.contexts = TlsContexts(tls)
        self.watch = CertWatch(self.contexts, "replica 0", clock=clock)
        self.client_serials: list[int] = []
        self.shown = anyio.Event()
        self.listener = ClientListener((HOST, 0), tls, handle=self._handle,
                                       contexts=self.contexts)

    async def _handle(self, identity: Identity, connection: FramedConnection) -> None:
        der = connection.stream.extra(TLSAttribute.peer_certificate_binary)
        assert der is not None
        self.client_serials.append(x509.load_der_x509_certificate(der).serial_number)
        self.shown.set()

    @property
    def address(self) -> tuple[str, int]:
        assert self.listener.address is not None
        return self.listener.address


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@pytest.fixture
def authority() -> CertificateAuthority:
    return CertificateAuthority.create()


@pytest.fixture
def admin(authority: CertificateAuthority, tmp_path: pathlib.Path) -> TlsConfig:
    tls = files_in(tmp_path / "admin", "admin", authority)
    write_pair(authority, tls, ADMIN, days=30)
    return tls


@pytest.mark.parametrize("replacement", ["another pair's key", "another CA", "another identity",
                                         "half-written", "key removed", "expired"])
async def test_a_bad_replacement_is_refused_and_the_old_certificate_still_offered(
        replacement: str, authority: CertificateAuthority, admin: TlsConfig,
        tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    served = files_in(tmp_path / "replica", "replica-0", authority)
    old = write_pair(authority, served, REPLICA, days=3)
    offset = datetime.timedelta(0)
    server = Server(served, lambda: now() + offset)
    other = files_in(tmp_path / "other", "other", authority)
    expected_file, reason = served.cert_file, ""
    if replacement == "another pair's key":
        write_pair(authority, other, REPLICA, days=365)
        write_pair(authority, served, REPLICA, days=365)
        served.key_file.write_bytes(other.key_file.read_bytes())
        expected_file, reason = served.key_file, "is not the key of the certificate"
    elif replacement == "another CA":
        write_pair(CertificateAuthority.create(), served, REPLICA, days=365)
        reason = "was not issued by a CA in"
    elif replacement == "another identity":
        write_pair(authority, served, Identity.replica(1), days=365)
        reason = "names cellar://replica/1, not cellar://replica/0"
    elif replacement == "half-written":
        write_pair(authority, other, REPLICA, days=365)
        whole = other.cert_file.read_bytes()
        served.cert_file.write_bytes(whole[:len(whole) // 2])
        served.key_file.write_bytes(other.key_file.read_bytes())
        reason = "is not a whole PEM certificate"
    elif replacement == "key removed":
        served.key_file.unlink()
        expected_file, reason = served.key_file, "cannot be read"
    else:
        write_pair(authority, served, REPLICA, days=30)
        offset = 31 * DAY  # the watch's clock: past the new pair's end (and the old one's)
        reason = "expired at"
    caplog.set_level(logging.INFO, logger="cellar.transport")
    with anyio.fail_after(WAIT_S):
        async with anyio.create_task_group() as tasks:
            await tasks.start(server.listener.run)
            server.watch.look()
            server.watch.look()  # said once while the files stay as they are
            assert await served_serial(server.address, admin) == old
            tasks.cancel_scope.cancel()
    refusals = [line for line in lines(caplog, logging.WARNING) if "are refused:" in line]
    assert len(refusals) == 1, refusals
    assert str(expected_file) in refusals[0] and reason in refusals[0], refusals[0]
    assert reason in server.watch.status()["cert_files_refused"]
    assert server.contexts.taken == 0
    assert not any("took the renewed" in line for line in lines(caplog, logging.INFO))


async def test_a_renewal_half_written_at_one_look_is_taken_at_the_next(
        authority: CertificateAuthority, admin: TlsConfig, tmp_path: pathlib.Path,
        caplog: pytest.LogCaptureFixture) -> None:
    served = files_in(tmp_path / "replica", "replica-0", authority)
    old = write_pair(authority, served, REPLICA, days=3)
    server = Server(served, now)
    other = files_in(tmp_path / "other", "other", authority)
    renewed = write_pair(authority, other, REPLICA, days=365)
    caplog.set_level(logging.INFO, logger="cellar.transport")
    with anyio.fail_after(WAIT_S):
        async with anyio.create_task_group() as tasks:
            await tasks.start(server.listener.run)
            # the key written, the certificate still the old one: a mismatch for now
            served.key_file.write_bytes(other.key_file.read_bytes())
            server.watch.look()
            assert await served_serial(server.address, admin) == old
            assert server.watch.refused is not None
            served.cert_file.write_bytes(other.cert_file.read_bytes())
            server.watch.look()
            assert await served_serial(server.address, admin) == renewed
            assert "cert_files_refused" not in server.watch.status()
            tasks.cancel_scope.cancel()
    assert server.watch.seconds_left() > 300 * DAY.total_seconds()


async def test_a_pair_not_yet_valid_is_taken_once_it_is(
        authority: CertificateAuthority, admin: TlsConfig, tmp_path: pathlib.Path,
        caplog: pytest.LogCaptureFixture) -> None:
    served = files_in(tmp_path / "replica", "replica-0", authority)
    old = write_pair(authority, served, REPLICA, days=3)
    offset = -2 * DAY  # the watch's clock: before the new pair's start
    server = Server(served, lambda: now() + offset)
    renewed = write_pair(authority, served, REPLICA, days=365)
    caplog.set_level(logging.INFO, logger="cellar.transport")
    with anyio.fail_after(WAIT_S):
        async with anyio.create_task_group() as tasks:
            await tasks.start(server.listener.run)
            server.watch.look()
            assert await served_serial(server.address, admin) == old
            assert "is not valid before" in (server.watch.refused or "")
            offset = datetime.timedelta(0)  # the files unchanged, the time come
            server.watch.look()
            assert await served_serial(server.address, admin) == renewed
            tasks.cancel_scope.cancel()


async def test_a_ca_change_is_taken_with_the_ca_file(
        authority: CertificateAuthority, tmp_path: pathlib.Path) -> None:
    served = files_in(tmp_path / "replica", "replica-0", authority)
    write_pair(authority, served, REPLICA, days=3)
    server = Server(served, now)
    successor = CertificateAuthority.create(common_name="Cellar cluster CA 2")
    both = authority.certificate_pem + successor.certificate_pem
    new_admin = files_in(tmp_path / "admin2", "admin", successor)
    new_admin.ca_file.write_bytes(both)
    write_pair(successor, new_admin, ADMIN, days=30)
    with anyio.fail_after(WAIT_S):
        async with anyio.create_task_group() as tasks:
            await tasks.start(server.listener.run)
            served.ca_file.write_bytes(both)  # first the CA file with both CAs, ...
            renewed = write_pair(successor, served, REPLICA, days=365)  # ... then the pair
            server.watch.look()
            assert server.watch.refused is None
            # a client of the new CA is accepted, and is offered the new CA's certificate
            assert await served_serial(server.address, new_admin) == renewed
            with anyio.fail_after(WAIT_S):
                await server.shown.wait()
            tasks.cancel_scope.cancel()


async def test_a_node_agent_dials_with_its_renewed_certificate(
        authority: CertificateAuthority, tmp_path: pathlib.Path) -> None:
    replica = files_in(tmp_path / "replica", "replica-0", authority)
    write_pair(authority, replica, REPLICA, days=365)
    server = Server(replica, now)
    node = files_in(tmp_path / "node", "node-n0", authority)
    ending_soon = write_pair(authority, node, NODE, days=3)
    contexts = TlsContexts(node)
    config = agent_config("n0", tmp_path / "state", insecure=False,
                          tls=TlsFiles(ca=node.ca_file, cert=node.cert_file, key=node.key_file))
    # as `cellar agent` builds them: the watch renews what the store client dials with
    agent = Agent(config, cast(GpuBackend, None), cast(GpuStore, None), tls_contexts=contexts)
    connect = connector(node, contexts=contexts)
    watch = agent.cert_watch
    assert watch is not None and watch.contexts is contexts
    with anyio.fail_after(WAIT_S):
        async with anyio.create_task_group() as tasks:
            await tasks.start(server.listener.run)
            endpoint = f"{HOST}:{server.address[1]}"
            connection = await connect(endpoint)
            await server.shown.wait()
            server.shown = anyio.Event()
            renewed = write_pair(authority, node, NODE, days=365)
            watch.look()
            again = await connect(endpoint)
            await server.shown.wait()
            await anyio.aclose_forcefully(connection.stream)
            await anyio.aclose_forcefully(again.stream)
            tasks.cancel_scope.cancel()
    assert server.client_serials == [ending_soon, renewed]
    assert watch.seconds_left() > 300 * DAY.total_seconds()  # gpu_agent_tls_cert_seconds_left
