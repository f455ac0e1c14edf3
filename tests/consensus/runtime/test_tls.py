"""TLS and identities: the identity in a certificate is read for every role and anything else is
refused; the contexts demand TLS 1.2+ and a verified certificate on both sides; plain TCP needs
`insecure=True` and warns.

Certificates come from `consensus.runtime.certs` (trustme cannot write URI names); the handshake
tests run over loopback sockets on asyncio and on trio."""

from __future__ import annotations

import logging
import pathlib
import ssl

import anyio
import pytest
import trustme

from consensus.envelope import Principal, Role
from consensus.runtime.certs import CertificateAuthority, identities, init_directory
from consensus.runtime.framing import IDENTITY_REFUSED, TLS_REFUSED, Metrics
from consensus.runtime.tls import (
    Identity,
    IdentityRefused,
    IdentityRole,
    TlsConfig,
    TlsFileRefused,
    check_security,
    identity_from_certificate,
    parse_identity_uri,
    tls_handshake,
)

pytestmark = pytest.mark.anyio
EVERY_ROLE = [Identity.replica(0), Identity.replica(14), Identity(IdentityRole.ADMIN, "alice"),
              Identity(IdentityRole.SCHEDULER, "sched-a"),
              Identity(IdentityRole.NODE, "gpu-node-17")]



@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("certs")
    init_directory(directory, [*EVERY_ROLE, Identity.replica(1)])
    return directory


def peer_certificate(*names: tuple[str, str]) -> dict[str, object]:
    """A certificate as `getpeercert()` gives it, with these subject alternative names."""
    return {"subject": ((("commonName", "x"),),), "subjectAltName": names}


@pytest.mark.parametrize("identity", EVERY_ROLE, ids=str)
def test_each_role_is_read_from_its_uri(identity: Identity) -> None:
    found = identity_from_certificate(peer_certificate(
        ("DNS", "localhost"), ("URI", identity.uri), ("IP Address", "127.0.0.1")))
    assert found == identity
    assert parse_identity_uri(f"cellar://{identity.role.value}/{identity.name}") == identity


@pytest.mark.parametrize(("names", "reason"), [
    ((), "expected one"),
    ((("DNS", "cellar.example"),), "expected one"),
    ((("URI", "cellar://replica/1"), ("URI", "cellar://admin/eve")), "expected one"),
    ((("URI", "cellar://root/eve"),), "root"),
    ((("URI", "cellar://system/cellar"),), "system"),
    ((("URI", "cellar://node/"),), "not cellar"),
    ((("URI", "cellar://node/../etc"),), "not cellar"),
    ((("URI", "cellar://node/a/b"),), "not cellar"),
    ((("URI", "cellar://admin/alice?role=replica"),), "not cellar"),
    ((("URI", "cellar://replica/01"),), "does not match"),
    ((("URI", "cellar://replica/15"),), "not below"),
    ((("URI", "cellar://replica/two"),), "does not match"),
    ((("URI", "CELLAR://admin/alice"),), "not cellar"),
])
def test_anything_else_is_refused(names: tuple[tuple[str, str], ...], reason: str) -> None:
    with pytest.raises(IdentityRefused, match=reason):
        identity_from_certificate(peer_certificate(*names))


def test_no_certificate_is_refused() -> None:
    for certificate in (None, dict[str, object]()):
        with pytest.raises(IdentityRefused, match="no validated"):
            identity_from_certificate(certificate)


def test_uris_of_other_schemes_are_ignored() -> None:
    names = (("URI", "spiffe://example.org/x"), ("URI", "cellar://node/n1"))
    assert identity_from_certificate(peer_certificate(*names)) == Identity(IdentityRole.NODE,
                                                                           "n1")


def test_a_client_identity_becomes_the_principal_stamped_on_its_commands() -> None:
    assert Identity(IdentityRole.NODE, "gpu-node-17").principal() == Principal(Role.NODE,
                                                                               "gpu-node-17")
    assert Identity(IdentityRole.ADMIN, "alice").principal() == Principal(Role.ADMIN, "alice")
    with pytest.raises(ValueError, match="not a client"):
        Identity.replica(2).principal()
    assert Identity.replica(2).replica_id == 2
    assert str(Identity.replica(2)) == "cellar://replica/2"


def test_the_contexts_require_tls_1_2_and_a_verified_certificate(
        certificates: pathlib.Path) -> None:
    config = TlsConfig.in_directory(certificates, Identity.replica(0))
    assert config.cert_file == certificates / "replica-0.pem"
    assert config.key_file == certificates / "replica-0.key"
    for context in (config.server_context(), config.client_context()):
        assert context.minimum_version == ssl.TLSVersion.TLSv1_2
        assert context.verify_mode == ssl.CERT_REQUIRED


@pytest.mark.parametrize(("field", "content", "reason"), [
    ("ca", "not a certificate\n", "holds no usable certificate (NO_CERTIFICATE_OR_CRL_FOUND)"),
    ("cert", "", "holds no usable certificate (NO_CERTIFICATE_OR_CRL_FOUND)"),
    ("key", "not a key\n", "is not a usable private key (not PEM of the expected kind)"),
    ("key", "replica-1.key", "does not match the certificate"),
])
def test_a_tls_file_that_cannot_serve_is_named_by_the_check(
        certificates: pathlib.Path, tmp_path: pathlib.Path, field: str, content: str,
        reason: str) -> None:
    """OpenSSL's `[SSL] PEM lib` names no file: the check says which one, and why."""
    good = TlsConfig.in_directory(certificates, Identity.replica(0))
    good.check()
    files = {"ca": good.ca_file, "cert": good.cert_file, "key": good.key_file}
    bad = tmp_path / f"bad-{field}"
    source = certificates / content
    bad.write_bytes(source.read_bytes() if content.endswith(".key") else content.encode())
    files[field] = bad
    config = TlsConfig(ca_file=files["ca"], cert_file=files["cert"], key_file=files["key"])
    with pytest.raises(TlsFileRefused) as refused:
        config.check()
    assert refused.value.field == field and str(refused.value).startswith(f"{bad} {reason}")


async def handshake(server: ssl.SSLContext, client: ssl.SSLContext,
                    ) -> tuple[Identity | None, Identity | None, Metrics]:
    """Both ends of one loopback handshake: what each learned of the other, and the counts."""
    metrics = Metrics()
    learned: dict[str, Identity | None] = {}
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)

    async def accept(stream: anyio.abc.SocketStream) -> None:
        accepted = await tls_handshake(stream, server, server_side=True, metrics=metrics)
        learned["server"] = accepted[1] if accepted else None
        done.set()

    done = anyio.Event()
    with anyio.fail_after(10):
        async with listener, anyio.create_task_group() as group:
            group.start_soon(listener.serve, accept)
            stream = await anyio.connect_tcp("127.0.0.1", port)
            accepted = await tls_handshake(stream, client, server_side=False, metrics=metrics)
            learned["client"] = accepted[1] if accepted else None
            await done.wait()
            if accepted:
                await accepted[0].aclose()
            group.cancel_scope.cancel()
    return learned["server"], learned["client"], metrics


@pytest.mark.parametrize("identity", EVERY_ROLE, ids=str)
async def test_each_role_is_read_from_a_real_certificate(certificates: pathlib.Path,
                                                         identity: Identity) -> None:
    server = TlsConfig.in_directory(certificates, Identity.replica(1)).server_context()
    client = TlsConfig.in_directory(certificates, identity).client_context()
    assert await handshake(server, client) == (identity, Identity.replica(1), Metrics())


async def test_a_client_without_a_certificate_is_refused(certificates: pathlib.Path) -> None:
    server = TlsConfig.in_directory(certificates, Identity.replica(1)).server_context()
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.load_verify_locations(cafile=str(certificates / "ca.pem"))
    server_learned, _, metrics = await handshake(server, client)
    assert server_learned is None
    assert metrics[TLS_REFUSED] >= 1


async def test_a_certificate_from_another_ca_is_refused(certificates: pathlib.Path,
                                                        tmp_path: pathlib.Path) -> None:
    stranger = trustme.CA()
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.load_verify_locations(cafile=str(certificates / "ca.pem"))
    stranger.issue_cert("localhost").configure_cert(client)
    server = TlsConfig.in_directory(certificates, Identity.replica(1)).server_context()
    server_learned, _, metrics = await handshake(server, client)
    assert server_learned is None
    assert metrics[TLS_REFUSED] >= 1


async def test_our_ca_without_a_cellar_name_is_refused(certificates: pathlib.Path,
                                                       tmp_path: pathlib.Path) -> None:
    issued = CertificateAuthority.load(certificates).issue(None, hosts=["localhost"])
    (tmp_path / "anonymous.pem").write_bytes(issued.certificate_pem)
    (tmp_path / "anonymous.key").write_bytes(issued.key_pem)
    anonymous = TlsConfig(ca_file=certificates / "ca.pem", cert_file=tmp_path / "anonymous.pem",
                          key_file=tmp_path / "anonymous.key")
    server = TlsConfig.in_directory(certificates, Identity.replica(1)).server_context()
    server_learned, _, metrics = await handshake(server, anonymous.client_context())
    assert server_learned is None
    assert (metrics[TLS_REFUSED], metrics[IDENTITY_REFUSED]) == (0, 1)


def test_plain_tcp_needs_insecure_and_warns(caplog: pytest.LogCaptureFixture,
                                            certificates: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="insecure=True"):
        check_security(None, insecure=False, what="test")
    with pytest.raises(ValueError, match="choose one"):
        check_security(TlsConfig.in_directory(certificates, Identity.replica(0)), insecure=True,
                       what="test")
    with caplog.at_level(logging.WARNING, logger="cellar.transport"):
        check_security(None, insecure=True, what="test")
    assert "plain TCP without TLS" in caplog.text
    assert "local development only" in caplog.text


def test_identities_refuse_bad_and_repeated_names() -> None:
    with pytest.raises(ValueError, match="does not match"):
        Identity(IdentityRole.NODE, "gpu node")
    with pytest.raises(ValueError, match="named twice"):
        identities(replicas=1, nodes=["a", "a"])
    with pytest.raises(ValueError, match="replicas"):
        identities(replicas=16)
