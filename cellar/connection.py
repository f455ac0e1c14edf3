"""How the operator commands reach a cluster: endpoints, certificates and identity options.

    --endpoints 127.0.0.1:7100,127.0.0.1:7101   (or --config replica.toml: its peers' clients)
    --certs DIR --as admin:alice                (the files `cellar certs init` wrote)
    --insecure                                  (plain TCP, development only; warns)

A malformed endpoint or identity is a usage error (argparse's message, exit status 2 unless the
command chose its own); a configuration file or certificate that cannot be read ends the command
with one line naming it, and the command's `exit_status` for it (`client_from`).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from consensus.runtime.arguments import seconds
from consensus.runtime.client import DEADLINE_S_MAX, CellarClient, ClientConfig
from consensus.runtime.config_fields import ConfigError
from consensus.runtime.connect import connector, split_endpoint
from consensus.runtime.node_config import load_peers
from consensus.runtime.tls import Identity, IdentityRole, TlsConfig


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--endpoints", type=endpoint_list,
                       help="replicas' client addresses, HOST:PORT,...")
    where.add_argument("--config", type=pathlib.Path,
                       help="a replica's configuration file: use its peers' client addresses")
    parser.add_argument("--certs", type=pathlib.Path, help="the certificate directory")
    parser.add_argument("--as", dest="identity", type=identity_argument,
                        default=Identity(IdentityRole.ADMIN, "admin"),
                        help="ROLE:NAME of the certificate to use (default admin:admin)")
    parser.add_argument("--insecure", action="store_true",
                        help="plain TCP, for a cluster started with insecure = true")
    parser.add_argument("--timeout", type=seconds(most=DEADLINE_S_MAX), default=15.0,
                        help=f"seconds per command (at most {DEADLINE_S_MAX:g})")


def endpoint_list(text: str) -> list[str]:
    """`--endpoints`: HOST:PORT,... checked where argparse reads it."""
    endpoints = [endpoint.strip() for endpoint in text.split(",") if endpoint.strip()]
    if not endpoints:
        raise argparse.ArgumentTypeError(f"no HOST:PORT in {text!r}")
    for endpoint in endpoints:
        try:
            split_endpoint(endpoint)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
    return endpoints


def identity_argument(text: str) -> Identity:
    """`--as ROLE:NAME`, checked where argparse reads it."""
    role, _, name = text.partition(":")
    try:
        return Identity(IdentityRole(role), name)
    except ValueError as error:
        roles = ", ".join(role.value for role in IdentityRole)
        raise argparse.ArgumentTypeError(f"{text!r} is not ROLE:NAME with ROLE one of {roles}"
                                         f" ({error})") from None


def endpoints_of(args: argparse.Namespace) -> list[str]:
    if args.endpoints:
        return list(args.endpoints)
    return [str(peer.client) for peer in load_peers(args.config)]


class _Unusable(Exception):
    """The options name no certificate directory, or one without the identity's files."""


def client_from(args: argparse.Namespace, *, exit_status: int | None = None) -> CellarClient:
    """The client the options describe; a file it cannot read ends the command with one line
    on stderr, and `exit_status` (by default 1, the line being SystemExit's code)."""
    try:
        return _client(args)
    except (ConfigError, OSError, _Unusable) as error:  # OSError: ssl.SSLError, a missing file
        message = f"cellar {args.command}: {error}"
    if exit_status is None:
        raise SystemExit(message)
    print(message, file=sys.stderr)
    raise SystemExit(exit_status)


def _client(args: argparse.Namespace) -> CellarClient:
    tls = None
    if not args.insecure:
        if args.certs is None:
            raise _Unusable("--certs DIR is needed (or --insecure for a plain-TCP cluster)")
        tls = TlsConfig.in_directory(args.certs, args.identity)
        for path in (tls.ca_file, tls.cert_file, tls.key_file):
            if not path.is_file():
                raise _Unusable(f"no {path}: `cellar certs init` (or `issue`) writes it for "
                                f"{args.identity}")
    config = ClientConfig(attempt_timeout_s=min(2.0, args.timeout), deadline_s=args.timeout)
    return CellarClient(endpoints_of(args), connector(tls, insecure=args.insecure), config)
