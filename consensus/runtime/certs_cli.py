"""`cellar certs init DIR` and `cellar certs issue DIR`: the cluster's CA and certificates.

`init` makes a new CA in DIR and issues a certificate for each replica (0 to N-1), admin,
scheduler and node agent named; `issue` adds certificates with the CA already in DIR (`--replica
ID` for one replica's). Neither replaces an existing file: to renew a certificate, move its pair
aside and issue it again. `consensus.runtime.certs` describes the files.

A certificate never outlives the CA that issued it: one asked for longer ends with the CA, and
the command says so, with the date (a new CA, and every certificate issued anew, before then).

Exit status: 0 written, 1 refused (a file exists, a bad name), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import datetime
import pathlib
import sys

from consensus.runtime.arguments import at_least

EXIT_WRITTEN, EXIT_REFUSED = 0, 1
REPLICAS_DEFAULT = 3
DAYS_MAX = 3650  # the CA's own validity (certs.CA_DAYS): a certificate ends with it at latest
ADMIN_DEFAULT = "admin"


def configure(parser: argparse.ArgumentParser) -> None:
    subparsers = parser.add_subparsers(dest="certs_command", metavar="COMMAND", required=True)
    init = subparsers.add_parser("init", help="make a CA and the cluster's certificates",
                                 description="Make a new CA in DIR and issue certificates.")
    _add_identity_arguments(init, replicas_default=REPLICAS_DEFAULT,
                            admin_help=f"an administrator (repeatable; default "
                                       f"{ADMIN_DEFAULT!r})")
    init.set_defaults(handler=run_init)
    issue = subparsers.add_parser("issue", help="issue more certificates with DIR's CA",
                                  description="Issue certificates with the CA in DIR.")
    _add_identity_arguments(issue, replicas_default=0,
                            admin_help="an administrator (repeatable)")
    issue.add_argument("--replica", type=at_least(0), action="append", default=[], metavar="ID",
                       help="one replica's certificate, to add it, or to renew it once its "
                            "old pair is moved aside (repeatable)")
    issue.set_defaults(handler=run_issue)


def _add_identity_arguments(parser: argparse.ArgumentParser, *, replicas_default: int,
                            admin_help: str) -> None:
    parser.add_argument("directory", metavar="DIR", help="where the CA and certificates live")
    parser.add_argument("--replicas", type=at_least(0), default=replicas_default, metavar="N",
                        help=f"replicas 0 to N-1 (default {replicas_default})")
    parser.add_argument("--admin", action="append", default=[], metavar="NAME", help=admin_help)
    parser.add_argument("--scheduler", action="append", default=[], metavar="NAME",
                        help="a scheduler (repeatable)")
    parser.add_argument("--node", nargs="+", action="extend", default=[], metavar="ID",
                        help="node agents, by node id (repeatable)")
    parser.add_argument("--host", action="append", default=[], metavar="NAME",
                        help="a DNS name or IP address replicas serve on (repeatable; "
                             "default localhost and 127.0.0.1)")
    parser.add_argument("--days", type=at_least(1, most=DAYS_MAX), default=365, metavar="DAYS",
                        help=f"validity of the certificates issued (default 365, at most "
                             f"{DAYS_MAX})")


def run_init(args: argparse.Namespace) -> int:
    return _run(args, init=True)


def run_issue(args: argparse.Namespace) -> int:
    return _run(args, init=False)


def _run(args: argparse.Namespace, *, init: bool) -> int:
    from consensus.runtime import certs  # noqa: PLC0415 - cryptography only when needed

    authority: certs.CertificateAuthority | None = None
    directory = pathlib.Path(args.directory)
    admins = args.admin or ([ADMIN_DEFAULT] if init else [])
    hosts = args.host or list(certs.SERVER_HOSTS_DEFAULT)
    try:
        wanted = certs.identities(replicas=args.replicas, admins=admins,
                                  schedulers=args.scheduler, nodes=args.node,
                                  replica_ids=getattr(args, "replica", ()))
        if not wanted and not init:
            raise ValueError("nothing to issue: name at least one identity")
        if init:
            written = certs.init_directory(directory, wanted, hosts=hosts, days=args.days)
        else:
            authority = certs.CertificateAuthority.load(directory)
            written = certs.issue_into(directory, authority, wanted, hosts=hosts,
                                       days=args.days)
    except (OSError, ValueError) as error:
        print(f"cellar certs: {error}", file=sys.stderr)
        return EXIT_REFUSED
    for path in written:
        print(path)
    ends = None if authority is None else authority.certificate.not_valid_after_utc
    # init makes a CA that ends CA_DAYS ahead, and no certificate is asked for longer
    if ends is not None and ends < (datetime.datetime.now(datetime.UTC)
                                    + datetime.timedelta(days=args.days)):
        print(f"cellar certs: these certificates end with the CA, at {ends:%Y-%m-%d %H:%M} "
              f"UTC, not {args.days} days from now: make a new CA (`cellar certs init` in "
              f"another directory), trust both during the change (one CA file holding both "
              f"certificates), and issue every certificate anew before then", file=sys.stderr)
    print(f"{len(wanted)} certificate(s) in {directory}; keep {directory / certs.CA_KEY_NAME} "
          f"secret (offline, in production)", file=sys.stderr)
    return EXIT_WRITTEN
