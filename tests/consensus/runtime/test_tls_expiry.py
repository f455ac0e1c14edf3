"""Certificates that expire: an operator is told ahead, and a client told why it is refused.

- `TlsConfig.check` (which a replica and an agent run at start) warns, naming the date, when
  the certificate ends within CERT_EXPIRY_WARNING_DAYS: `cellar certs init` issues every
  certificate of a cluster at once, so they all end at the same instant, and nothing said so.
- A client whose own certificate expired while it ran was refused without a reason: under TLS
  1.3 its handshake completes before the server checks its certificate, and the server's
  alert never comes back (the server closes), so the connection simply ended. It now refuses
  to dial, naming its certificate file and the date.
- A client refused by a replica whose certificate expired (or one of another CA) got "the TLS
  handshake failed", the reason left in an INFO log line; the refusal now carries it.

Certificates are built with `cryptography`, backdated so that they are already expired: no
test waits for a clock."""

from __future__ import annotations

import datetime
import logging
import pathlib

import anyio
import anyio.abc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from consensus.runtime.certs import CertificateAuthority, identities, init_directory
from consensus.runtime.connect import ConnectRefused, connector
from consensus.runtime.framing import Metrics
from consensus.runtime.tls import Identity, IdentityRole, TlsConfig, tls_handshake

pytestmark = pytest.mark.anyio
HOST = "127.0.0.1"
ADMIN = Identity(IdentityRole.ADMIN, "alice")


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("certs")
    init_directory(directory, identities(replicas=1, admins=[ADMIN.name]))
    return directory


def expired(directory: pathlib.Path, target: pathlib.Path, identity: Identity) -> TlsConfig:
    """A certificate for `identity` from the CA in `directory` that ended an hour ago."""
    authority = CertificateAuthority.load(directory)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([])).issuer_name(authority.certificate.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=2))
        .not_valid_after(now - datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(
            identity.uri)]), critical=False)
        .sign(authority.key, hashes.SHA256()))
    config = TlsConfig(ca_file=directory / "ca.pem", cert_file=target / "expired.pem",
                       key_file=target / "expired.key")
    config.cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    config.key_file.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return config


def test_a_certificate_ending_soon_is_warned_of_at_the_check(
        tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    init_directory(tmp_path, [ADMIN], days=3)
    config = TlsConfig.in_directory(tmp_path, ADMIN)
    with caplog.at_level(logging.WARNING, logger="cellar.transport"):
        config.check()
    ends = x509.load_pem_x509_certificate(config.cert_file.read_bytes()).not_valid_after_utc
    assert [record.levelno for record in caplog.records] == [logging.WARNING]
    assert str(config.cert_file) in caplog.text
    assert f"{ends:%Y-%m-%d %H:%M} UTC" in caplog.text


def test_a_certificate_far_from_its_end_is_not_warned_of(
        certificates: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="cellar.transport"):
        TlsConfig.in_directory(certificates, ADMIN).check()
    assert caplog.records == []


async def serve_once(config: TlsConfig, *,
                     task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
                     ) -> None:
    """Accept connections with `config` as a replica would, and keep each until it ends."""
    context = config.server_context()

    async def handle(stream: anyio.abc.SocketStream) -> None:
        accepted = await tls_handshake(stream, context, server_side=True, metrics=Metrics())
        if accepted is not None:
            async with accepted[0]:
                await accepted[0].receive()

    listener = await anyio.create_tcp_listener(local_host=HOST)
    async with listener:
        task_status.started(listener.extra(anyio.abc.SocketAttribute.local_port))
        await listener.serve(handle)


async def test_a_client_whose_certificate_expired_is_told_so(
        certificates: pathlib.Path, tmp_path: pathlib.Path) -> None:
    client = expired(certificates, tmp_path, ADMIN)
    connect = connector(client)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            port = await group.start(serve_once,
                                     TlsConfig.in_directory(certificates, Identity.replica(0)))
            # Without the fix: the handshake completes (TLS 1.3), the connection comes back,
            # and only its first read ends, with no reason given.
            with pytest.raises(ConnectRefused, match="expired") as refused:
                connection = await connect(f"{HOST}:{port}")
                await connection.stream.aclose()
            assert str(client.cert_file) in str(refused.value)
            group.cancel_scope.cancel()


async def test_a_replica_whose_certificate_expired_refuses_with_the_reason(
        certificates: pathlib.Path, tmp_path: pathlib.Path) -> None:
    replica = expired(certificates, tmp_path, Identity.replica(0))
    connect = connector(TlsConfig.in_directory(certificates, ADMIN))
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            port = await group.start(serve_once, replica)
            with pytest.raises(ConnectRefused, match="certificate has expired"):
                await connect(f"{HOST}:{port}")
            group.cancel_scope.cancel()
