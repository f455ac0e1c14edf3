"""`cellar certs issue` during a CA change: `ca.pem` holds the old and the new CA (replicas
trust both) and `ca.key` is the new CA's. `CertificateAuthority.load` read only the first
certificate of the file, so the new key was refused as "not the key of the CA certificate".
It now signs with the certificate in the file that carries `ca.key`, whatever its place."""

from __future__ import annotations

import datetime
import pathlib

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from cellar.cli import main
from consensus.runtime import certs
from consensus.runtime.certs import CertificateAuthority
from consensus.runtime.tls import Identity, TlsConfig


def _key_pem(authority: CertificateAuthority) -> bytes:
    return authority.key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption())


def _bundle(directory: pathlib.Path, authorities: list[CertificateAuthority],
            key_of: CertificateAuthority) -> None:
    certs.write_new_file(directory / certs.CA_CERT_NAME,
                         b"".join(authority.certificate_pem for authority in authorities), 0o644)
    certs.write_new_file(directory / certs.CA_KEY_NAME, _key_pem(key_of), 0o600)


def _issued(path: pathlib.Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


@pytest.mark.parametrize("new_first", [False, True])
def test_issue_signs_with_the_new_ca_of_a_two_ca_bundle(
        tmp_path: pathlib.Path, new_first: bool) -> None:
    old = CertificateAuthority.create(common_name="old CA")
    new = CertificateAuthority.create(common_name="new CA")
    _bundle(tmp_path, [new, old] if new_first else [old, new], key_of=new)
    assert main(["certs", "issue", str(tmp_path), "--replica", "0", "--node", "gpu-1"]) == 0
    for name in ("replica-0.pem", "node-gpu-1.pem"):
        issued = _issued(tmp_path / name)
        assert issued.issuer == new.certificate.subject
        issued.verify_directly_issued_by(new.certificate)  # raises if another key signed it
    # a replica that trusts both CAs accepts its certificate from the new one
    TlsConfig.in_directory(tmp_path, Identity.replica(0)).check()


def test_a_key_of_neither_ca_in_the_bundle_is_refused(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    one, two, stranger = (CertificateAuthority.create() for _ in range(3))
    _bundle(tmp_path, [one, two], key_of=stranger)
    assert main(["certs", "issue", str(tmp_path), "--node", "gpu-1"]) == 1
    error = capsys.readouterr().err
    assert "not the key of any of the 2 CA certificates" in error
    assert not (tmp_path / "node-gpu-1.pem").exists()


def test_an_expired_ca_in_the_bundle_is_still_refused(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    fresh, other = CertificateAuthority.create(), CertificateAuthority.create()
    now = datetime.datetime.now(datetime.UTC)
    expired = (x509.CertificateBuilder().subject_name(fresh.certificate.subject)
               .issuer_name(fresh.certificate.subject).public_key(fresh.key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(days=30))
               .not_valid_after(now - datetime.timedelta(minutes=10))
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .sign(fresh.key, hashes.SHA256()))
    _bundle(tmp_path, [other, CertificateAuthority(expired, fresh.key)], key_of=fresh)
    assert main(["certs", "issue", str(tmp_path), "--node", "gpu-1"]) == 1
    assert "expired" in capsys.readouterr().err
    assert not (tmp_path / "node-gpu-1.pem").exists()


def test_one_key_in_a_renewed_ca_certificate_signs_with_the_later_one(
        tmp_path: pathlib.Path) -> None:
    """A CA certificate renewed on the same key: the bundle holds both; the later-ending one
    signs, so certificates are not cut short by the CA about to end."""
    short = CertificateAuthority.create(days=10)
    renewed = CertificateAuthority.create(days=400)
    renewed = CertificateAuthority(
        x509.CertificateBuilder().subject_name(short.certificate.subject)
        .issuer_name(short.certificate.subject).public_key(short.key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(renewed.certificate.not_valid_before_utc)
        .not_valid_after(renewed.certificate.not_valid_after_utc)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(short.key, hashes.SHA256()), short.key)
    _bundle(tmp_path, [short, renewed], key_of=short)
    loaded = CertificateAuthority.load(tmp_path)
    assert loaded.certificate == renewed.certificate
