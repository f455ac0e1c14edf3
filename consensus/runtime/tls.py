"""Mutual TLS, and the identity each certificate carries.

Every replica and every client holds a certificate issued by the cluster's own CA
(`cellar certs init`). Both ends of every connection present one and check the other's against
that CA (TLS 1.2 or newer). Who the peer is comes from exactly one URI subject alternative name:

    cellar://replica/<id>       a replica, <id> its number (0, 1, 2, ...)
    cellar://admin/<name>       an administrator
    cellar://scheduler/<name>   a scheduler
    cellar://node/<node id>     the node agent of one node; its principal name is the node id

A certificate with no such name, with two, or with one that does not parse is refused. Host
names are not checked (`check_hostname` is off): the CA is the cluster's own, and a dialer checks
that the replica it reached has the identity it expected, which is the stronger statement.

Plain TCP is for local development only, and only when asked for with `insecure=True`: it logs
a warning, nothing is encrypted, and identities come from nowhere (a replica's is its claim,
a client's is a configured default).

`TlsConfig.check` loads the files as the contexts will, for a command to refuse bad material at
start naming the file at fault: OpenSSL's own error for a file that is not a key is
`[SSL] PEM lib`, naming none. It warns, naming the date, of a certificate that ends within
CERT_EXPIRY_WARNING_DAYS: `cellar certs init` issues a whole cluster's certificates at once,
so they all end at the same instant.

A process's listeners and dialers share one `TlsContexts` and read its contexts at the start
of each handshake. A replica's or a node agent's `CertWatch` (`cert_watch.py`) reads the files
again every hour and, when they changed, `TlsConfig.load_checked` judges the new pair as a
peer would (whole PEM, the key the certificate's, issued by a CA in the CA file, valid now,
naming the same identity): a pair it takes serves every new connection and handshake (those
up keep the context they began with until they reconnect); one it refuses leaves the old
contexts in use. The CA file is read again with them, so a CA change (`certs.py`) is taken the
same way.
"""

from __future__ import annotations

import datetime
import enum
import hashlib
import logging
import pathlib
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
from anyio.streams.tls import TLSAttribute, TLSStream

from consensus.config import REPLICA_COUNT_MAX
from consensus.envelope import PRINCIPAL_NAME_PATTERN, Principal, Role
from consensus.runtime.framing import IDENTITY_REFUSED, TLS_REFUSED, Metrics, TransportError

logger = logging.getLogger("cellar.transport")

IDENTITY_SCHEME = "cellar"
HANDSHAKE_TIMEOUT_S = 5.0
CERT_EXPIRY_WARNING_DAYS = 30  # `check` warns of a certificate that ends sooner
_NAME = re.compile(PRINCIPAL_NAME_PATTERN)
_REPLICA_NAME = re.compile(r"0|[1-9][0-9]{0,3}")
_URI = re.compile(rf"{IDENTITY_SCHEME}://(?P<role>[a-z]+)/(?P<name>{PRINCIPAL_NAME_PATTERN})")
# Connection failures: ssl.SSLError and TimeoutError are OSErrors; anyio adds its own.
CONNECTION_ERRORS = (OSError, anyio.BrokenResourceError, anyio.EndOfStream,
                     anyio.ClosedResourceError)


class IdentityRole(enum.StrEnum):
    """What a certificate says its holder is."""

    REPLICA = "replica"
    ADMIN = "admin"
    SCHEDULER = "scheduler"
    NODE = "node"


CLIENT_ROLES = frozenset({IdentityRole.ADMIN, IdentityRole.SCHEDULER, IdentityRole.NODE})


class IdentityRefused(TransportError):
    """A peer's certificate carries no acceptable identity, or not the one expected."""


@dataclass(frozen=True, slots=True)
class Identity:
    """Who is at the other end of a connection: a role and a name (a replica's name is its id)."""

    role: IdentityRole
    name: str

    def __post_init__(self) -> None:
        pattern = _REPLICA_NAME if self.role is IdentityRole.REPLICA else _NAME
        if not pattern.fullmatch(self.name):
            raise ValueError(f"{self.role.value} name {self.name!r} does not match "
                             f"{pattern.pattern}")
        if self.role is IdentityRole.REPLICA and int(self.name) >= REPLICA_COUNT_MAX:
            raise ValueError(f"replica id {self.name} is not below {REPLICA_COUNT_MAX}")

    @classmethod
    def replica(cls, replica_id: int) -> Identity:
        return cls(IdentityRole.REPLICA, str(replica_id))

    @property
    def uri(self) -> str:
        return f"{IDENTITY_SCHEME}://{self.role.value}/{self.name}"

    @property
    def replica_id(self) -> int:
        assert self.role is IdentityRole.REPLICA, self
        return int(self.name)

    def principal(self) -> Principal:
        """The principal the runtime stamps on this client's commands (never for a replica)."""
        if self.role is IdentityRole.REPLICA:
            raise ValueError(f"{self.uri} is a replica, not a client")
        return Principal(Role(self.role.value), self.name)

    def __str__(self) -> str:
        return self.uri


def parse_identity_uri(uri: str) -> Identity:
    """The identity a `cellar://<role>/<name>` URI names; raises IdentityRefused otherwise."""
    match = _URI.fullmatch(uri)
    if match is None:
        raise IdentityRefused(f"{uri!r} is not cellar://<role>/<name>")
    try:
        role = IdentityRole(match["role"])
        return Identity(role, match["name"])
    except ValueError as error:
        raise IdentityRefused(f"{uri!r}: {error}") from None


def identity_from_certificate(certificate: Mapping[str, Any] | None) -> Identity:
    """The identity in a validated peer certificate (`SSLObject.getpeercert()` form).

    Exactly one URI subject alternative name must use the cellar scheme; other names (DNS, IP,
    URIs of other schemes) are ignored. Raises IdentityRefused for anything else.
    """
    if not certificate:
        raise IdentityRefused("no validated peer certificate")
    names = certificate.get("subjectAltName", ())
    uris = [value for kind, value in names
            if kind == "URI" and value.lower().startswith(f"{IDENTITY_SCHEME}:")]
    if len(uris) != 1:
        raise IdentityRefused(f"expected one {IDENTITY_SCHEME}:// name, found {uris}")
    return parse_identity_uri(uris[0])


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsConfig:
    """Where one party's TLS material is: the cluster CA, its certificate and its key (PEM)."""

    ca_file: pathlib.Path
    cert_file: pathlib.Path
    key_file: pathlib.Path

    @classmethod
    def in_directory(cls, directory: pathlib.Path | str, identity: Identity) -> TlsConfig:
        """The files `cellar certs init` writes for `identity` in `directory`."""
        base = pathlib.Path(directory)
        stem = f"{identity.role.value}-{identity.name}"
        return cls(ca_file=base / "ca.pem", cert_file=base / f"{stem}.pem",
                   key_file=base / f"{stem}.key")

    def server_context(self) -> ssl.SSLContext:
        """For accepting: presents our certificate, requires and verifies the client's."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._configure(context)
        context.num_tickets = 0  # no session resumption: connections are few and long-lived
        return context

    def client_context(self) -> ssl.SSLContext:
        """For dialing: presents our certificate, verifies the server's against the CA."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False  # the identity is checked instead; see the module doc
        self._configure(context)
        return context

    def _configure(self, context: ssl.SSLContext) -> None:
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cafile=str(self.ca_file))
        context.load_cert_chain(certfile=str(self.cert_file), keyfile=str(self.key_file))

    def check(self) -> None:
        """Build both contexts; TlsFileRefused, naming the file at fault, if either fails."""
        try:
            self.server_context()
            self.client_context()
        except OSError as error:  # ssl.SSLError is one, as is a file that cannot be read
            raise self._refusal(error) from error
        ends = self._check_chain()
        left = ends - datetime.datetime.now(datetime.UTC)
        if left < datetime.timedelta(days=CERT_EXPIRY_WARNING_DAYS):
            logger.warning("%s ends at %s UTC, in %d day(s): issue a new one (`cellar certs "
                           "issue`, after moving this pair aside) into its place before then "
                           "(a running replica or agent takes it within the hour, without a "
                           "restart); no peer accepts it after", self.cert_file,
                           f"{ends:%Y-%m-%d %H:%M}", left.days)

    def stamp(self) -> bytes:
        """A digest of the three files' bytes: what a watch compares to notice a change (a
        rename over the file, a rewrite in place, a half-written file later completed).
        OSError if one cannot be read."""
        digest = hashlib.sha256()
        for path in (self.ca_file, self.cert_file, self.key_file):
            data = path.read_bytes()
            digest.update(len(data).to_bytes(8, "big"))
            digest.update(data)
        return digest.digest()

    def load(self) -> TlsMaterial:
        """Both contexts, as at start: OSError (ssl.SSLError) or ValueError for files that
        cannot be loaded at all; nothing else is judged (`check` does, for a command)."""
        from cryptography import x509  # noqa: PLC0415 - as certs.py: only when needed

        stamp = self.stamp()
        certificate = x509.load_pem_x509_certificate(self.cert_file.read_bytes())
        return TlsMaterial(server=self.server_context(), client=self.client_context(),
                           stamp=stamp, certificate=certificate)

    def load_checked(self, now: datetime.datetime, *, identity: Identity | None = None,
                     presented: TlsMaterial | None = None) -> TlsMaterial:
        """Both contexts from the files as they are now, once the pair is one every peer would
        accept at `now`; TlsFileRefused naming the file and why otherwise: a file that cannot
        be read or is not whole PEM (half-written), a key not the certificate's, a certificate
        the CA file's CAs did not issue, one not yet valid or ended, one naming another
        identity than `identity`, a CA file without the CA that issued the certificate
        `presented` now while that one is valid (the CA its peers' certificates are of too:
        taking it would refuse every peer not yet renewed, a rotation without the overlap
        `certs.py` asks for), a certificate the library cannot judge (a malformed extension:
        refused, never raised past the caller), or files that changed while being read."""
        try:
            return self._load_checked(now, identity, presented)
        except TlsFileRefused:
            raise
        except Exception as error:  # any file a watch reads is refused, never fatal
            raise TlsFileRefused("cert", self.cert_file, f"cannot be judged "
                                 f"({type(error).__name__}: {error})") from error

    def _load_checked(self, now: datetime.datetime, identity: Identity | None,
                      presented: TlsMaterial | None) -> TlsMaterial:
        from cryptography.exceptions import InvalidSignature  # noqa: PLC0415

        try:
            stamp = self.stamp()
        except OSError as error:
            path = pathlib.Path(error.filename) if error.filename else self.cert_file
            raise TlsFileRefused(self._field_of(path), path,
                                 f"cannot be read ({_reason(error)})") from error
        certificate, authorities, key = self._parsed()
        if _public_der(key.public_key()) != _public_der(certificate.public_key()):
            raise TlsFileRefused("key", self.key_file,
                                 f"is not the key of the certificate {self.cert_file}")
        if certificate.not_valid_after_utc <= now:
            raise TlsFileRefused("cert", self.cert_file, f"expired at "
                                 f"{certificate.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")
        if certificate.not_valid_before_utc > now:
            raise TlsFileRefused("cert", self.cert_file, f"is not valid before "
                                 f"{certificate.not_valid_before_utc:%Y-%m-%d %H:%M} UTC")
        if not any(_issued_by(certificate, authority, InvalidSignature)
                   for authority in authorities):
            raise TlsFileRefused("cert", self.cert_file,
                                 f"was not issued by a CA in {self.ca_file}")
        if presented is not None and presented.not_after > now and not any(
                _issued_by(presented.certificate, authority, InvalidSignature)
                for authority in authorities):
            raise TlsFileRefused(
                "ca", self.ca_file, f"holds no CA that issued the certificate presented now "
                f"(serial {presented.serial:x}), the CA of every peer not yet renewed: this "
                f"process would refuse them all; keep the old CA in it beside the new one "
                f"until every certificate is renewed")
        named = _identity_or_none(certificate)
        if named is None:
            raise TlsFileRefused("cert", self.cert_file, f"names no one {IDENTITY_SCHEME}:// "
                                                         "identity")
        if identity is not None and named != identity:
            raise TlsFileRefused("cert", self.cert_file, f"names {named}, not {identity}")
        try:
            server, client = self.server_context(), self.client_context()
        except OSError as error:  # ssl.SSLError too
            raise self._refusal(error) from error
        try:
            unchanged = self.stamp() == stamp
        except OSError:
            unchanged = False
        if not unchanged:
            raise TlsFileRefused("cert", self.cert_file, "changed while being read (a renewal "
                                 "being written?): looked at again later")
        return TlsMaterial(server=server, client=client, stamp=stamp, certificate=certificate)

    def _parsed(self) -> tuple[Any, list[Any], Any]:
        """The certificate, the CA file's certificates and the key, each whole PEM;
        TlsFileRefused naming the first file that is not."""
        from cryptography import x509  # noqa: PLC0415 - as certs.py: only when needed
        from cryptography.hazmat.primitives import serialization  # noqa: PLC0415

        try:
            certificate = x509.load_pem_x509_certificate(self.cert_file.read_bytes())
        except (OSError, ValueError) as error:
            raise TlsFileRefused("cert", self.cert_file, "is not a whole PEM certificate "
                                 "(half-written?)") from error
        try:
            authorities = x509.load_pem_x509_certificates(self.ca_file.read_bytes())
        except (OSError, ValueError) as error:
            raise TlsFileRefused("ca", self.ca_file, "holds no whole PEM certificate "
                                 "(half-written?)") from error
        try:
            key = serialization.load_pem_private_key(self.key_file.read_bytes(), None)
        except (OSError, ValueError, TypeError) as error:
            raise TlsFileRefused("key", self.key_file, "is not a whole, unencrypted PEM "
                                 "private key (half-written?)") from error
        return certificate, authorities, key

    def _field_of(self, path: pathlib.Path) -> str:
        return {self.ca_file: "ca", self.key_file: "key"}.get(path, "cert")

    def _check_chain(self) -> datetime.datetime:
        """When the certificate ends; TlsFileRefused if it has ended or the CA did not issue
        it: no peer would accept it. (Not yet valid is left to the peers' clocks.)"""
        from cryptography import x509  # noqa: PLC0415 - as certs.py: only when needed
        from cryptography.exceptions import InvalidSignature  # noqa: PLC0415

        try:
            certificate = x509.load_pem_x509_certificate(self.cert_file.read_bytes())
            authorities = x509.load_pem_x509_certificates(self.ca_file.read_bytes())
        except (OSError, ValueError) as error:
            raise TlsFileRefused("cert", self.cert_file, f"cannot be read ({error})") from error
        now = datetime.datetime.now(datetime.UTC)
        if certificate.not_valid_after_utc < now:
            raise TlsFileRefused("cert", self.cert_file,
                                 f"expired at {certificate.not_valid_after_utc:%Y-%m-%d %H:%M} "
                                 "UTC; issue a new one (`cellar certs issue`, after moving "
                                 "this pair aside: it never overwrites a file)")
        if any(_issued_by(certificate, authority, InvalidSignature)
               for authority in authorities):
            return certificate.not_valid_after_utc
        raise TlsFileRefused("cert", self.cert_file, f"was not issued by the CA in "
                                                     f"{self.ca_file}")

    def _refusal(self, error: OSError) -> TlsFileRefused:
        """Which file made `error`: the CA's or the certificate's if either alone fails to
        load as certificates, else the key."""
        for field, path in (("ca", self.ca_file), ("cert", self.cert_file)):
            try:
                ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=str(path))
            except OSError as failure:
                return TlsFileRefused(field, path, f"holds no usable certificate "
                                                   f"({_reason(failure)})")
        if isinstance(error, ssl.SSLError) and error.reason == "KEY_VALUES_MISMATCH":
            return TlsFileRefused("key", self.key_file,
                                  f"does not match the certificate {self.cert_file}")
        return TlsFileRefused("key", self.key_file, f"is not a usable private key "
                                                    f"({_reason(error)})")


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsMaterial:
    """One reading of a party's files: its two contexts, the digest of the files they were
    built from (`TlsConfig.stamp`), and the certificate they present."""

    server: ssl.SSLContext
    client: ssl.SSLContext
    stamp: bytes
    certificate: Any  # the one presented (`cryptography`'s), to judge a CA file change by

    @property
    def serial(self) -> int:
        return int(self.certificate.serial_number)

    @property
    def not_after(self) -> datetime.datetime:
        ends: datetime.datetime = self.certificate.not_valid_after_utc
        return ends

    @property
    def identity(self) -> Identity | None:
        return _identity_or_none(self.certificate)


class TlsContexts:
    """The contexts one process accepts and dials with, shared by its listeners and dialers.

    Every handshake reads `server` or `client` as it starts, so `take` (a `CertWatch` taking a
    renewed pair) changes what every new connection presents and trusts, and no connection
    already up. Built at once from `tls`: OSError or ValueError as `TlsConfig.load`.
    """

    def __init__(self, tls: TlsConfig) -> None:
        self.tls = tls
        self.material = tls.load()
        self.taken = 0  # pairs taken since the start

    @property
    def server(self) -> ssl.SSLContext:
        return self.material.server

    @property
    def client(self) -> ssl.SSLContext:
        return self.material.client

    @property
    def ends(self) -> datetime.datetime:
        """When the certificate presented now ends."""
        return self.material.not_after

    def take(self, material: TlsMaterial) -> None:
        """Present `material` from the next handshake on."""
        self.material = material
        self.taken += 1


def contexts_of(tls: TlsConfig | None, shared: TlsContexts | None, *, what: str,
                ) -> TlsContexts | None:
    """`shared` (a process's, which its `CertWatch` renews), else contexts of `tls` built now
    and never renewed; None for plain TCP. ValueError if `shared` is of other files."""
    if shared is None:
        return None if tls is None else TlsContexts(tls)
    if shared.tls != tls:
        raise ValueError(f"{what}: contexts of {shared.tls.cert_file}, configured with "
                         f"{None if tls is None else tls.cert_file}")
    return shared


def identity_of(certificate: Any) -> Identity:
    """The identity a `cryptography` certificate names (its one cellar:// URI), as a peer
    reads it from the handshake; IdentityRefused if it names none, or more than one."""
    from cryptography import x509  # noqa: PLC0415 - as certs.py: only when needed

    try:
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        names = None
    uris = [] if names is None else names.value.get_values_for_type(
        x509.UniformResourceIdentifier)
    return identity_from_certificate({"subjectAltName": tuple(("URI", uri) for uri in uris)})


def _identity_or_none(certificate: Any) -> Identity | None:
    try:
        return identity_of(certificate)
    except IdentityRefused:
        return None


def _public_der(key: Any) -> bytes:
    """A public key's encoding, to compare two keys."""
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415

    return bytes(key.public_bytes(serialization.Encoding.DER,
                                  serialization.PublicFormat.SubjectPublicKeyInfo))


def _issued_by(certificate: Any, authority: Any, invalid: type[Exception]) -> bool:
    try:
        certificate.verify_directly_issued_by(authority)
    except (ValueError, TypeError, invalid):
        return False
    return True


class TlsFileRefused(ValueError):
    """A TLS file that cannot be used; `field` is the configuration's name for it ("ca",
    "cert" or "key")."""

    def __init__(self, field: str, path: pathlib.Path, reason: str) -> None:
        super().__init__(f"{path} {reason}")
        self.field = field


def _reason(error: OSError) -> str:
    """OpenSSL's reason ("NO_CERTIFICATE_OR_CRL_FOUND"), or the system's ("Permission
    denied"); `[SSL] PEM lib` has neither: the file is not PEM of the kind expected."""
    if isinstance(error, ssl.SSLError):
        return error.reason or "not PEM of the expected kind"
    return error.strerror or str(error)


def check_security(tls: TlsConfig | None, *, insecure: bool, what: str) -> None:
    """Refuse plain TCP unless asked for explicitly, and warn when it is."""
    if tls is not None and insecure:
        raise ValueError(f"{what}: insecure=True with a TLS configuration; choose one")
    if tls is None and not insecure:
        raise ValueError(f"{what}: no TLS configuration; plain TCP needs insecure=True "
                         f"(local development only)")
    if insecure:
        logger.warning("%s: plain TCP without TLS: nothing is encrypted and no peer is "
                       "authenticated; for local development only", what)


async def tls_handshake(
    stream: anyio.abc.ByteStream, context: ssl.SSLContext, *, server_side: bool,
    metrics: Metrics, timeout_s: float = HANDSHAKE_TIMEOUT_S, reasons: list[str] | None = None,
) -> tuple[TLSStream, Identity] | None:
    """Wrap `stream` in TLS and read the peer's identity; None (counted, closed) on failure.

    A failed handshake (no certificate, another CA, not TLS at all, too slow) counts as
    TLS_REFUSED; a valid certificate without a cellar identity as IDENTITY_REFUSED. The caller
    still decides whether the identity found may connect. `stream` is closed whenever no TLS
    stream comes back, cancellation from outside included. A failure's reason is appended to
    `reasons`, for a caller that reports it ("certificate has expired"): it is logged at INFO
    only, and a command-line client's user would never see it.
    """
    try:
        with anyio.fail_after(timeout_s):
            tls_stream = await TLSStream.wrap(stream, server_side=server_side,
                                              ssl_context=context, standard_compatible=False)
    except CONNECTION_ERRORS as error:
        metrics[TLS_REFUSED] += 1
        logger.info("TLS handshake with %s failed: %r", remote_address(stream), error)
        if reasons is not None:
            reasons.append(handshake_failure(error))
        await anyio.aclose_forcefully(stream)
        return None
    except BaseException:  # cancelled: the caller gets no stream to close
        await anyio.aclose_forcefully(stream)
        raise
    try:
        certificate = tls_stream.extra(TLSAttribute.peer_certificate)
        identity = identity_from_certificate(certificate)
    except IdentityRefused as error:
        metrics[IDENTITY_REFUSED] += 1
        logger.warning("refused %s: %s", remote_address(stream), error)
        if reasons is not None:
            reasons.append(str(error))
        await anyio.aclose_forcefully(tls_stream)
        return None
    return tls_stream, identity


def handshake_failure(error: BaseException) -> str:
    """Why a handshake failed, in words: the certificate check's verdict ("certificate has
    expired", "self-signed certificate in certificate chain": another CA), OpenSSL's reason
    (the peer's alert), or what became of the connection."""
    if isinstance(error, ssl.SSLCertVerificationError) and error.verify_message:
        return str(error.verify_message)
    if isinstance(error, ssl.SSLError) and error.reason:
        return str(error.reason)
    if isinstance(error, TimeoutError):
        return "timed out"
    if isinstance(error, anyio.EndOfStream | anyio.BrokenResourceError):
        return "the peer closed the connection (it may have refused our certificate)"
    return str(error) or type(error).__name__


def remote_host(stream: anyio.abc.ByteStream) -> str | None:
    """The peer's IP address without its port, or None when the socket has none to give."""
    try:
        address = stream.extra(anyio.abc.SocketAttribute.remote_address, None)
    except OSError:
        return None
    return str(address[0]) if isinstance(address, tuple) and address else None


def remote_address(stream: anyio.abc.ByteStream) -> str:
    """The peer's address for a log line; a socket already reset has none to give (anyio
    then leaves the attribute out, or an older one raises)."""
    try:
        address = stream.extra(anyio.abc.SocketAttribute.remote_address, None)
    except OSError:
        address = None
    if address is None:
        return "a closed connection"
    if isinstance(address, tuple):
        return f"{address[0]}:{address[1]}"
    return str(address)
