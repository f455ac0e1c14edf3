"""What a watch's look must refuse, never take or raise on (`cert_watch.py`, `tls.py`):

- a CA file that drops the CA of the certificate presented now, taken with a pair of a new CA
  in one go (a rotation without the overlap): the process would refuse every peer not yet
  renewed, and cut itself off from the cluster; the old files stay in use;
- a pair the cryptography library cannot judge (a certificate of the cluster's CA whose
  subjectAltName is malformed): refused and said, the look returns, the watch task (and the
  replica or agent it runs in) goes on.
"""

from __future__ import annotations

import datetime
import pathlib

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtensionOID, NameOID

from consensus.runtime.cert_watch import CertWatch
from consensus.runtime.certs import CertificateAuthority
from consensus.runtime.tls import Identity, TlsConfig, TlsContexts

REPLICA = Identity.replica(0)


def served(tmp_path: pathlib.Path, authority: CertificateAuthority) -> TlsConfig:
    tls = TlsConfig(ca_file=tmp_path / "ca.pem", cert_file=tmp_path / "replica-0.pem",
                    key_file=tmp_path / "replica-0.key")
    tls.ca_file.write_bytes(authority.certificate_pem)
    write_pair(authority, tls)
    return tls


def write_pair(authority: CertificateAuthority, tls: TlsConfig) -> None:
    issued = authority.issue(REPLICA, hosts=("127.0.0.1",), days=365)
    tls.cert_file.write_bytes(issued.certificate_pem)
    tls.key_file.write_bytes(issued.key_pem)


def test_a_ca_file_dropping_the_presented_certificates_ca_is_refused(
        tmp_path: pathlib.Path) -> None:
    authority = CertificateAuthority.create()
    tls = served(tmp_path, authority)
    contexts = TlsContexts(tls)
    watch = CertWatch(contexts, "replica 0")
    successor = CertificateAuthority.create(common_name="Cellar cluster CA 2")
    tls.ca_file.write_bytes(successor.certificate_pem)  # the old CA gone at once, ...
    write_pair(successor, tls)  # ... with a pair of the new one
    watch.look()
    refused = watch.refused or ""
    assert contexts.taken == 0
    assert str(tls.ca_file) in refused
    assert "holds no CA that issued the certificate presented" in refused
    # with the overlap (both CAs), the same pair is taken
    tls.ca_file.write_bytes(authority.certificate_pem + successor.certificate_pem)
    watch.look()
    assert contexts.taken == 1 and watch.refused is None
    # and once presented, the old CA may go
    tls.ca_file.write_bytes(successor.certificate_pem)
    watch.look()
    assert contexts.taken == 2 and watch.refused is None


def test_a_certificate_the_library_cannot_judge_is_refused_not_raised(
        tmp_path: pathlib.Path) -> None:
    authority = CertificateAuthority.create()
    tls = served(tmp_path, authority)
    contexts = TlsContexts(tls)
    watch = CertWatch(contexts, "replica 0")
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    malformed_san = x509.UnrecognizedExtension(ExtensionOID.SUBJECT_ALTERNATIVE_NAME,
                                               b"\x30\x03\x02\x01")
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "replica-0")]))
        .issuer_name(authority.certificate.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(malformed_san, critical=False)
        .sign(authority.key, hashes.SHA256()))
    tls.cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    tls.key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                               serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    watch.look()  # raised ValueError, which ended the watch task and the process with it
    assert contexts.taken == 0
    assert "cannot be judged" in (watch.refused or "")
