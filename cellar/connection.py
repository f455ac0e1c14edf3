"""How the operator commands reach a cluster: endpoints, certificates and identity options.

    --endpoints 127.0.0.1:7100,127.0.0.1:7101   (or --config replica.toml: its peers' clients)
    --certs DIR --as admin:alice                (the files `cellar certs init` wrote)
    --insecure                                  (plain TCP, development only; warns)
"""

from __future__ import annotations

import argparse
import pathlib

from consensus.runtime.arguments import seconds
from consensus.runtime.client import CellarClient, ClientConfig
from consensus.runtime.connect import connector
from consensus.runtime.node_config import load_node_config
from consensus.runtime.tls import Identity, IdentityRole, TlsConfig


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--endpoints", help="replicas' client addresses, HOST:PORT,...")
    where.add_argument("--config", type=pathlib.Path,
                       help="a replica's configuration file: use its peers' client addresses")
    parser.add_argument("--certs", type=pathlib.Path, help="the certificate directory")
    parser.add_argument("--as", dest="identity", default="admin:admin",
                        help="ROLE:NAME of the certificate to use (default admin:admin)")
    parser.add_argument("--insecure", action="store_true",
                        help="plain TCP, for a cluster started with insecure = true")
    parser.add_argument("--timeout", type=seconds(), default=15.0, help="seconds per command")


def endpoints_of(args: argparse.Namespace) -> list[str]:
    if args.endpoints:
        return [endpoint.strip() for endpoint in args.endpoints.split(",") if endpoint.strip()]
    config = load_node_config(args.config)
    return [str(peer.client) for peer in config.peers]


def client_from(args: argparse.Namespace) -> CellarClient:
    tls = None
    if not args.insecure:
        if args.certs is None:
            raise SystemExit("--certs DIR is needed (or --insecure for a plain-TCP cluster)")
        role, _, name = args.identity.partition(":")
        tls = TlsConfig.in_directory(args.certs, Identity(IdentityRole(role), name))
    config = ClientConfig(attempt_timeout_s=min(2.0, args.timeout), deadline_s=args.timeout)
    return CellarClient(endpoints_of(args), connector(tls, insecure=args.insecure), config)
