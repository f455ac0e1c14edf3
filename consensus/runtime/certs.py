"""The cluster's own certificate authority, and the certificates it issues.

A directory made by `init_directory` (the `cellar certs init` command) holds, in PEM:

    ca.pem, ca.key                          the CA (keep ca.key offline in production)
    replica-<id>.pem, replica-<id>.key      one per replica: client and server use
    admin-<name>.pem, .key                  clients: client use only
    scheduler-<name>.pem, node-<id>.pem, ...

`TlsConfig.in_directory(directory, identity)` finds one party's files. Each leaf certificate
names its identity in one URI subject alternative name (`consensus.runtime.tls` describes the
format); replica certificates also name the hosts they serve on (`localhost` and `127.0.0.1`
unless told otherwise), for tools that check host names. Keys are ECDSA P-256 and written
readable by their owner only; existing files are never overwritten.

Everything that can be refused is refused before the first file is written: a host name that
cannot go into a certificate (`--host` with a space or a non-ASCII letter) once left `init` with
a CA and no certificates, and `init` refuses a directory that has a CA. A CA that cannot issue
usable certificates is refused too: a `ca.key` that is not the key of `ca.pem` (its certificates
would name one CA and carry another's signature) or a CA past its end (its certificates would
be expired as issued), where `issue` had written both kinds and said they were written.

During a CA change `ca.pem` holds both CAs' certificates (peers then trust both) and `ca.key`
the new CA's key: `issue` signs with the certificate in `ca.pem` that carries `ca.key`. It once
read only the first certificate of the file, and refused the new key as not the CA's.

The standard library cannot issue certificates, so this module uses `cryptography`.
"""

from __future__ import annotations

import collections
import datetime
import ipaddress
import os
import pathlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from consensus.config import REPLICA_COUNT_MAX
from consensus.runtime.tls import Identity, IdentityRole, TlsConfig, identity_of

CA_DAYS = 3650
LEAF_DAYS = 365
BACKDATE = datetime.timedelta(hours=1)  # tolerate clocks a little behind the issuer's
SERVER_HOSTS_DEFAULT = ("localhost", "127.0.0.1")
CA_CERT_NAME = "ca.pem"
CA_KEY_NAME = "ca.key"
# A DNS name a certificate can carry: ASCII labels (an IDN in its xn-- form), a leading "*." for
# a wildcard; IP addresses are tried first (ipaddress), so "::1" never reaches this.
_DNS_NAME = re.compile(r"(\*\.)?[A-Za-z0-9_]([A-Za-z0-9_-]*)(\.[A-Za-z0-9_]([A-Za-z0-9_-]*))*\.?")
DNS_NAME_LENGTH_MAX = 253


@dataclass(frozen=True, slots=True)
class IssuedCertificate:
    certificate_pem: bytes
    key_pem: bytes


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _host_name(host: str) -> x509.GeneralName:
    """The subject alternative name for `host`; ValueError if it is neither an IP address nor
    a DNS name."""
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        pass
    if len(host) > DNS_NAME_LENGTH_MAX or not _DNS_NAME.fullmatch(host):
        raise ValueError(f"host {host!r} is neither an IP address nor a DNS name (ASCII "
                         f"letters, digits, '-' and '.'; an IDN in its xn-- form)")
    return x509.DNSName(host)


def check_hosts(hosts: Iterable[str]) -> None:
    """ValueError naming the first of `hosts` a certificate cannot carry."""
    for host in hosts:
        _host_name(host)


class CertificateAuthority:
    """A self-signed CA that issues the cluster's certificates."""

    def __init__(self, certificate: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        self.certificate = certificate
        self.key = key

    @classmethod
    def create(cls, *, common_name: str = "Cellar cluster CA", days: int = CA_DAYS,
               ) -> CertificateAuthority:
        key = _new_key()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = datetime.datetime.now(datetime.UTC)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE).not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256())
        )
        return cls(certificate, key)

    @classmethod
    def load(cls, directory: pathlib.Path) -> CertificateAuthority:
        """The CA of `directory`: `ca.key` and, of the certificates in `ca.pem`, the one that
        carries that key (during a CA change `ca.pem` holds the old and the new CA, so that
        peers trust both, and `ca.key` is the new one's). ValueError if none carries it."""
        authorities = x509.load_pem_x509_certificates((directory / CA_CERT_NAME).read_bytes())
        try:
            key = serialization.load_pem_private_key((directory / CA_KEY_NAME).read_bytes(),
                                                     None)
        except TypeError:  # encrypted: cryptography wants a password
            raise ValueError(f"{directory / CA_KEY_NAME}: encrypted with a passphrase, which "
                             f"this command cannot use") from None
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{directory / CA_KEY_NAME}: not an ECDSA key")
        public = _public_bytes(key.public_key())
        matching = [certificate for certificate in authorities
                    if _public_bytes(certificate.public_key()) == public]
        if not matching:
            held = "the CA certificate" if len(authorities) == 1 else (
                f"any of the {len(authorities)} CA certificates in")
            raise ValueError(f"{directory / CA_KEY_NAME}: not the key of {held} "
                             f"{directory / CA_CERT_NAME}; no peer would accept what it "
                             f"signs")
        # one key in two certificates: a CA certificate renewed on its key; the later-ending
        # one (an expired one is refused by `issue`, as with a single certificate)
        return cls(max(matching, key=lambda certificate: certificate.not_valid_after_utc), key)

    @property
    def certificate_pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def save(self, directory: pathlib.Path) -> list[pathlib.Path]:
        return [write_new_file(directory / CA_CERT_NAME, self.certificate_pem, 0o644),
                write_new_file(directory / CA_KEY_NAME, _key_pem(self.key), 0o600)]

    def issue(self, identity: Identity | None, *, hosts: Sequence[str] = (),
              days: int = LEAF_DAYS, extra_uris: Sequence[str] = ()) -> IssuedCertificate:
        """A certificate for `identity`, serving `hosts` too if it is a replica's.

        `identity=None` and `extra_uris` exist for tests of what the transport refuses.
        ValueError if the CA has expired (what it issued now would be expired as issued) or
        a host cannot be named in a certificate.
        """
        now = datetime.datetime.now(datetime.UTC)
        ends = self.certificate.not_valid_after_utc
        if ends <= now:
            raise ValueError(f"the CA expired at {ends:%Y-%m-%d %H:%M} UTC: every certificate "
                             f"it issues is expired as issued; make a new CA (`cellar certs "
                             f"init` in another directory) and issue every certificate anew")
        key = _new_key()
        names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(uri) for uri in
                                         ([identity.uri] if identity else []) + list(extra_uris)]
        names += [_host_name(host) for host in hosts]
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
        if identity is None or identity.role is IdentityRole.REPLICA:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        common_name = identity.uri if identity else "no cellar identity"
        # never past the CA's own end: the chain could not be verified then
        not_after = min(now + datetime.timedelta(days=days),
                        self.certificate.not_valid_after_utc)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.certificate.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE).not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=False,
                crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                self.key.public_key()), critical=False)
        )
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        certificate = builder.sign(self.key, hashes.SHA256())
        return IssuedCertificate(certificate.public_bytes(serialization.Encoding.PEM),
                                 _key_pem(key))


def write_new_file(path: pathlib.Path, data: bytes, mode: int) -> pathlib.Path:
    """Write `data` to a file that must not exist yet, created with `mode`."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(descriptor, "wb") as file:
        file.write(data)
    return path


def write_identity(directory: pathlib.Path, authority: CertificateAuthority, identity: Identity,
                   *, hosts: Sequence[str] = SERVER_HOSTS_DEFAULT, days: int = LEAF_DAYS,
                   ) -> TlsConfig:
    """Issue and write the certificate and key of `identity`; hosts only serve replicas."""
    config = TlsConfig.in_directory(directory, identity)
    served = hosts if identity.role is IdentityRole.REPLICA else ()
    issued = authority.issue(identity, hosts=served, days=days)
    write_new_file(config.cert_file, issued.certificate_pem, 0o644)
    write_new_file(config.key_file, issued.key_pem, 0o600)
    return config


def identities(*, replicas: int, admins: Iterable[str] = (), schedulers: Iterable[str] = (),
               nodes: Iterable[str] = (), replica_ids: Iterable[int] = ()) -> list[Identity]:
    """The identities to issue, replicas first (0 to `replicas` - 1, then each of
    `replica_ids`: one replica's, to renew or add it); raises ValueError on a bad or repeated
    name."""
    if not 0 <= replicas <= REPLICA_COUNT_MAX:
        raise ValueError(f"replicas: {replicas} is not in [0, {REPLICA_COUNT_MAX}]")
    named = list(replica_ids)
    if any(not 0 <= replica_id < REPLICA_COUNT_MAX for replica_id in named):
        raise ValueError(f"replica: ids lie in [0, {REPLICA_COUNT_MAX - 1}], got {named}")
    found = [Identity.replica(replica_id) for replica_id in [*range(replicas), *named]]
    for role, names in ((IdentityRole.ADMIN, admins), (IdentityRole.SCHEDULER, schedulers),
                        (IdentityRole.NODE, nodes)):
        found += [Identity(role, name) for name in names]
    counts = collections.Counter(found)
    repeated = sorted(identity.uri for identity, count in counts.items() if count > 1)
    if repeated:
        raise ValueError(f"named twice: {', '.join(repeated)}")
    return found


def init_directory(directory: pathlib.Path, wanted: Sequence[Identity], *,
                   hosts: Sequence[str] = SERVER_HOSTS_DEFAULT, days: int = LEAF_DAYS,
                   ) -> list[pathlib.Path]:
    """Make a new CA in `directory` and issue a certificate for each identity wanted.

    Raises FileExistsError if the directory already has a CA (issue into it with `issue_into`).
    """
    directory.mkdir(parents=True, exist_ok=True)
    for name in (CA_CERT_NAME, CA_KEY_NAME):  # either: the pair must never be split
        if os.path.lexists(directory / name):
            raise FileExistsError(f"{directory / name} exists")
    _refuse_existing(directory, wanted)  # before the CA is written: a refusal changes nothing
    check_hosts(hosts)
    authority = CertificateAuthority.create()
    written = authority.save(directory)
    return written + issue_into(directory, authority, wanted, hosts=hosts, days=days)


def issue_into(directory: pathlib.Path, authority: CertificateAuthority,
               wanted: Sequence[Identity], *, hosts: Sequence[str] = SERVER_HOSTS_DEFAULT,
               days: int = LEAF_DAYS) -> list[pathlib.Path]:
    """Issue certificates for `wanted` with an existing CA; refuses to replace any file."""
    _refuse_existing(directory, wanted)
    check_hosts(hosts)
    written: list[pathlib.Path] = []
    for identity in wanted:
        config = write_identity(directory, authority, identity, hosts=hosts, days=days)
        written += [config.cert_file, config.key_file]
    return written


def _refuse_existing(directory: pathlib.Path, wanted: Sequence[Identity]) -> None:
    for identity in wanted:
        config = TlsConfig.in_directory(directory, identity)
        for path in (config.cert_file, config.key_file):
            if os.path.lexists(path):  # a dangling link too: O_EXCL would refuse it midway
                raise FileExistsError(f"{path} exists")


def _public_bytes(key: ec.EllipticCurvePublicKey | object) -> bytes:
    """A public key's encoding, to compare two keys (b"" for a kind that has none here)."""
    if not isinstance(key, ec.EllipticCurvePublicKey):
        return b""
    return key.public_bytes(serialization.Encoding.DER,
                            serialization.PublicFormat.SubjectPublicKeyInfo)


def identity_in_file(path: pathlib.Path) -> Identity:
    """The identity a certificate file names (its one cellar:// URI), so a process can check
    before it connects that it holds the certificate it is meant to act under."""
    return identity_of(x509.load_pem_x509_certificate(path.read_bytes()))
