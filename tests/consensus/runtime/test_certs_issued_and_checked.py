"""Certificates as issued and as checked at start: `cellar certs init` refused for an existing
CA key leaves the directory as it was (it wrote a new ca.pem beside the old key); an issued
certificate never outlives its CA; an encrypted CA key is refused, not a traceback; the start-up
check refuses a certificate the configured CA did not issue, or one that has expired (a replica
had come up and failed every handshake). Expired peers are refused in the handshake too."""

from __future__ import annotations

import datetime
import pathlib

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from cellar.cli import main
from consensus.runtime import certs
from consensus.runtime.certs import CertificateAuthority, init_directory, issue_into
from consensus.runtime.framing import TLS_REFUSED
from consensus.runtime.tls import Identity, IdentityRole, TlsConfig, TlsFileRefused
from tests.consensus.runtime.test_tls import handshake

NODE = Identity(IdentityRole.NODE, "gpu-1")


def _load(path: pathlib.Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_an_issued_certificate_never_outlives_its_ca(tmp_path: pathlib.Path) -> None:
    """certs_cli.DAYS_MAX says a certificate cannot outlive the CA; `issue` with a CA that has
    less time left than --days makes one that claims validity the chain can never give."""
    authority = CertificateAuthority.create(days=30)
    authority.save(tmp_path)
    issue_into(tmp_path, authority, [NODE], days=365)
    leaf = _load(TlsConfig.in_directory(tmp_path, NODE).cert_file)
    assert leaf.not_valid_after_utc <= authority.certificate.not_valid_after_utc


def test_init_refused_for_an_existing_ca_key_leaves_the_directory_as_it_was(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """init_directory: 'a refusal changes nothing'. With ca.key there but ca.pem gone, init
    writes a new ca.pem, then fails on ca.key: the CA key and certificate no longer match."""
    directory = tmp_path / "certs"
    assert main(["certs", "init", str(directory), "--replicas", "1"]) == 0
    (directory / "ca.pem").unlink()
    before = sorted(path.name for path in directory.iterdir())
    assert main(["certs", "init", str(tmp_path / "certs"), "--replicas", "0",
                 "--admin", "other"]) == 1
    assert sorted(path.name for path in directory.iterdir()) == before


def test_issue_with_an_encrypted_ca_key_is_refused_not_a_traceback(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Exit status 1 'refused' for a CA it cannot use; a passphrase-protected ca.key (a
    prudent way to keep it) raised TypeError out of `cellar certs issue`."""
    directory = tmp_path / "certs"
    assert main(["certs", "init", str(directory), "--replicas", "0"]) == 0
    key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
    (directory / "ca.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret")))
    assert main(["certs", "issue", str(directory), "--node", "gpu-9"]) == 1


def test_the_start_up_check_refuses_a_certificate_from_another_ca(
        tmp_path: pathlib.Path) -> None:
    """A replica (check_tls_files) or agent whose certificate the configured CA did not issue
    can talk to no one; the check that is meant to refuse what cannot serve passes it."""
    init_directory(tmp_path / "a", [Identity.replica(0)])
    init_directory(tmp_path / "b", [Identity.replica(0)])
    mixed = TlsConfig(ca_file=tmp_path / "a" / "ca.pem",
                      cert_file=tmp_path / "b" / "replica-0.pem",
                      key_file=tmp_path / "b" / "replica-0.key")
    with pytest.raises(TlsFileRefused) as refused:
        mixed.check()
    assert refused.value.field == "cert"


def test_the_start_up_check_refuses_an_expired_certificate(tmp_path: pathlib.Path) -> None:
    authority = CertificateAuthority.create()
    authority.save(tmp_path)
    config = TlsConfig.in_directory(tmp_path, Identity.replica(0))
    with pytest.MonkeyPatch.context() as patch:  # valid from 400 days ago to 30 days ago
        patch.setattr(certs, "BACKDATE", datetime.timedelta(days=400))
        certs.write_identity(tmp_path, authority, Identity.replica(0), days=-30)
    assert _load(config.cert_file).not_valid_after_utc < datetime.datetime.now(datetime.UTC)
    with pytest.raises(TlsFileRefused) as refused:
        config.check()
    assert refused.value.field == "cert"


@pytest.mark.anyio
async def test_sanity_an_expired_peer_certificate_is_refused_in_the_handshake(
        tmp_path: pathlib.Path) -> None:
    authority = CertificateAuthority.create()
    authority.save(tmp_path)
    certs.write_identity(tmp_path, authority, Identity.replica(1))
    with pytest.MonkeyPatch.context() as patch:  # valid from 400 days ago to 30 days ago
        patch.setattr(certs, "BACKDATE", datetime.timedelta(days=400))
        certs.write_identity(tmp_path, authority, NODE, days=-30)
    server = TlsConfig.in_directory(tmp_path, Identity.replica(1)).server_context()
    client = TlsConfig.in_directory(tmp_path, NODE).client_context()
    learned_server, _, metrics = await handshake(server, client)
    assert learned_server is None and metrics[TLS_REFUSED] >= 1
