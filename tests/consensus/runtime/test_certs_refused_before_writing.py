"""`cellar certs` refuses what cannot make usable certificates, and writes nothing then: a
`--host` a certificate cannot carry left `init` with a CA and no certificates (and a second
`init` refused, the CA being there); `issue` with a CA that has expired wrote certificates
expired as issued, and with a `ca.key` that is not `ca.pem`'s key certificates no peer
accepts, and said both were written (exit status 0)."""

from __future__ import annotations

import datetime
import pathlib

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from cellar.cli import main
from consensus.runtime import certs
from consensus.runtime.certs import CertificateAuthority


def _names(directory: pathlib.Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir()) if directory.exists() else []


@pytest.mark.parametrize("host", ["exämple.com", "a b", "", "host/path"])
def test_init_with_a_host_no_certificate_can_carry_writes_nothing(
        tmp_path: pathlib.Path, host: str, capsys: pytest.CaptureFixture[str]) -> None:
    directory = tmp_path / "certs"
    assert main(["certs", "init", str(directory), "--host", host]) == 1
    assert "host" in capsys.readouterr().err
    assert _names(directory) == []
    assert main(["certs", "init", str(directory)]) == 0  # nothing left in the way


def test_hosts_that_certificates_carry_are_accepted(tmp_path: pathlib.Path) -> None:
    assert main(["certs", "init", str(tmp_path / "certs"), "--host", "::1", "--host",
                 "xn--exmple-cua.com", "--host", "*.replicas.example", "--host",
                 "replica_0.local."]) == 0


def _expired_ca(directory: pathlib.Path) -> None:
    fresh = CertificateAuthority.create()
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(fresh.certificate.subject)
               .issuer_name(fresh.certificate.subject).public_key(fresh.key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(days=30))
               .not_valid_after(now - datetime.timedelta(minutes=10)))
    for extension in fresh.certificate.extensions:
        builder = builder.add_extension(extension.value, extension.critical)
    CertificateAuthority(builder.sign(fresh.key, hashes.SHA256()), fresh.key).save(directory)


def test_issue_with_an_expired_ca_is_refused(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    _expired_ca(tmp_path)
    before = _names(tmp_path)
    assert main(["certs", "issue", str(tmp_path), "--replica", "0"]) == 1
    assert "expired" in capsys.readouterr().err
    assert _names(tmp_path) == before


def test_issue_with_a_ca_key_that_is_not_the_certificates_is_refused(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    one, other = CertificateAuthority.create(), CertificateAuthority.create()
    certs.write_new_file(tmp_path / certs.CA_CERT_NAME, one.certificate_pem, 0o644)
    other_key = other.key.private_bytes(serialization.Encoding.PEM,
                                        serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption())
    certs.write_new_file(tmp_path / certs.CA_KEY_NAME, other_key, 0o600)
    before = _names(tmp_path)
    assert main(["certs", "issue", str(tmp_path), "--node", "gpu-1"]) == 1
    assert "not the key" in capsys.readouterr().err
    assert _names(tmp_path) == before
