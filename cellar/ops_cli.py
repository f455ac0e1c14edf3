"""`cellar status` and `cellar admin`: what an operator runs against a live cluster.

`status` asks every replica for its role, view, sequencer, executed and committed slots, lag
behind the furthest replica, connected peers and the days left to the certificate it presents
(`-` on plain TCP, or from a build that does not say; `!` and a line saying when and what to
do under CERT_EXPIRY_WARNING_DAYS); a replica that does not answer is shown down.
Its exit statuses (`STATUS_EXIT_STATUSES`) judge a majority of the cluster's replicas, counted
from the `--config` file's peers or from what the replicas that answer say of the cluster's
size, never of the endpoints listed alone (two of five listed and answering are no majority):
0 a majority answered (the cluster can serve), 1 some but fewer than a majority did, 2 none
did, 64 a command line it cannot parse, 78 a configuration file or certificate it cannot use.
`admin` issues the state machine's admin commands (apply a configuration, cordon, uncordon,
drain, mark a node or GPU bad or clear it, deregister a node) and its queries (gangs, one gang
with why it is pending, nodes, one node, the cluster view, stats). Its exit statuses
(`ADMIN_EXIT_STATUSES`) tell apart what an operator does next: 0 done, 1 rejected by the state
machine (nothing changed) or a bad file, 2 no replica reached in time (nothing applied), 3
outcome unknown (the command may have been applied: look before trying again), 4 forbidden to
this identity, 5 refused by the replica (a malformed request, or an answer too large for a
frame).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from cellar.connection import add_connection_arguments, client_from, endpoints_of
from cellar.exception_groups import run_unwrapped
from cellar.spec_file import SpecFileError, load_spec
from consensus.runtime.arguments import at_least, usage_errors_exit
from consensus.runtime.client import (
    ClientError,
    Forbidden,
    OutcomeUnknown,
    Rejected,
    ReplyTooLarge,
)
from consensus.runtime.clock_agreement import SKEW_MS_MAX
from consensus.runtime.node_config import load_peers
from consensus.runtime.tls import CERT_EXPIRY_WARNING_DAYS
from statemachine.errors import Code, Rejection
from statemachine.result_codec import result_to_plain
from statemachine.results import GroupPhase
from statemachine.store import GpuStore

EXIT_REJECTED, EXIT_UNREACHABLE, EXIT_OUTCOME_UNKNOWN, EXIT_FORBIDDEN, EXIT_REFUSED = 1, 2, 3, 4, 5
EXIT_NO_MAJORITY = 1  # `status`: some replicas answered, fewer than a majority
EXIT_USAGE = 64  # `status`, EX_USAGE: a command line it cannot parse (argparse's 2 is "none")
EXIT_CONFIG = 78  # `status`, EX_CONFIG: a configuration file or certificate it cannot use
STATUS_EXIT_STATUSES = """exit status (a majority of the cluster's replicas: of the --config
file's peers, or of the cluster's size the replicas that answer report):
  0   a majority of the cluster's replicas answered
  1   some replicas answered, fewer than a majority of the cluster's
  2   no replica answered
  64  a command line it cannot parse
  78  a configuration file or certificate it cannot use (or no --certs for a TLS cluster)"""
VERSION_MAX = (1 << 63) - 1  # the state machine's integers are signed 64-bit
ADMIN_EXIT_STATUSES = """exit status:
  0  done
  1  rejected by the state machine (nothing changed), or a bad configuration file
  2  no replica reached in time (nothing was applied)
  3  outcome unknown: the command may have been applied (or ran, and its answer was too large
     to send); look before trying again
  4  forbidden: this identity may not issue that command or ask that query
  5  refused by the replica: a malformed request, or a query's answer too large for a frame"""
# A client error's exit status and what to say before its message, most specific first.
_CLIENT_ERRORS: tuple[tuple[type[ClientError], int, str], ...] = (
    (OutcomeUnknown, EXIT_OUTCOME_UNKNOWN, "outcome unknown, it may have been applied: "),
    (Forbidden, EXIT_FORBIDDEN, "forbidden: "),
    (Rejected, EXIT_REFUSED, "refused by the replica: "),
    (ReplyTooLarge, EXIT_REFUSED, "refused by the replica: "),
)


def configure(parser: argparse.ArgumentParser) -> None:
    """`cellar status` (the module's default command)."""
    configure_status(parser)


def configure_status(parser: argparse.ArgumentParser) -> None:
    parser.epilog = STATUS_EXIT_STATUSES
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    usage_errors_exit(parser, EXIT_USAGE)
    add_connection_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run_status)


def run_status(args: argparse.Namespace) -> int:
    statuses = run_unwrapped(_statuses, args)
    replica_count = cluster_size(statuses, configured=_configured_size(args))
    running = len({status.get("replica_id", status["endpoint"]) for status in statuses
                   if status.get("running")})
    if args.json:
        print(json.dumps({"replicas": statuses, "replica_count": replica_count},
                         default=str))
    else:
        for line in status_table(statuses):
            print(line)
        print(f"{running} of {replica_count} replicas answered")
    if not running:
        return EXIT_UNREACHABLE
    return 0 if running > replica_count // 2 else EXIT_NO_MAJORITY


def cluster_size(statuses: list[dict[str, Any]], *, configured: int | None) -> int:
    """The replicas a majority is counted of: the most that the configuration file or any
    replica that answered says the cluster has (the larger, should they differ: a majority of
    it is a majority of the smaller too), else as many as the endpoints listed."""
    reported = [status["replica_count"] for status in statuses if status.get("running")
                and type(status.get("replica_count")) is int]
    known = max([*reported, configured or 0])
    return known if known > 0 else len({status["endpoint"] for status in statuses})


def _configured_size(args: argparse.Namespace) -> int | None:
    """How many replicas the `--config` file names (already read once by `client_from`)."""
    if getattr(args, "config", None) is None:
        return None
    return len(load_peers(args.config))


async def _statuses(args: argparse.Namespace) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    async with client_from(args, exit_status=EXIT_CONFIG) as client:
        for endpoint in endpoints_of(args):
            try:
                with anyio.fail_after(args.timeout):
                    status = await client.status(endpoint)
            except (ClientError, TimeoutError, OSError) as error:
                status = {"endpoint": endpoint, "running": False, "error": str(error)}
            found.append({"endpoint": endpoint, **status})
    return found


def status_table(statuses: list[dict[str, Any]]) -> list[str]:
    furthest = max((status.get("executed_slots", 0) for status in statuses), default=0)
    lines = [f"{'replica':>7} {'endpoint':>21} {'role':>9} {'view':>5} {'status':>12} "
             f"{'sequencer':>9} {'executed':>9} {'committed':>9} {'lag':>5} {'peers':>7} "
             f"{'cert':>7}"]
    for status in statuses:
        if not status.get("running"):
            lines.append(f"{'?':>7} {status['endpoint']:>21} {'down':>9}  "
                         f"({status.get('error', 'no answer')})")
            continue
        role = "sequencer" if status["is_sequencer"] else "follower"
        peers = ",".join(str(peer) for peer in status.get("peers_connected", []))
        lines.append(
            f"{status['replica_id']:>7} {status['endpoint']:>21} {role:>9} "
            f"{status['view']:>5} {status['status']:>12} {status['sequencer']:>9} "
            f"{status['executed_slots']:>9} {status['commit_prefix']:>9} "
            f"{furthest - status['executed_slots']:>5} {peers:>7} {_cert_days(status):>7}")
        lines.extend(f"{'':>7} refuses replica {peer}: {reason}"
                     for peer, reason in sorted(status.get("peers_refused", {}).items()))
        if status.get("rejoin"):
            lines.append(f"{'':>7} rejoin: {status['rejoin']}")
        if status.get("clock_agrees") is False and status.get("clock_offsets_ms"):
            offsets = ", ".join(f"replica {peer} {offset:+} ms" for peer, offset
                                in sorted(status["clock_offsets_ms"].items()))
            lines.append(f"{'':>7} clock: not within {SKEW_MS_MAX / 1000:g} s of a majority "
                         f"(peers' offsets: "
                         f"{offsets}); no Ticks while sequencer: fix its time, restart it")
        if (ending := _cert_ending(status)) is not None:
            lines.append(f"{'':>7} certificate: {ending}")
    return lines


def _days_left(status: dict[str, Any]) -> int | None:
    days = status.get("cert_days_left")
    return days if type(days) is int else None


def _cert_days(status: dict[str, Any]) -> str:
    """The certificate column: days left, `!` under CERT_EXPIRY_WARNING_DAYS; `-` for none."""
    days = _days_left(status)
    if days is None:
        return "-"
    if days < 0:
        return "expired"
    return f"{days}d" + ("!" if days < CERT_EXPIRY_WARNING_DAYS else "")


def _cert_ending(status: dict[str, Any]) -> str | None:
    """What to say of a certificate under CERT_EXPIRY_WARNING_DAYS, or None."""
    days = _days_left(status)
    if days is None or days >= CERT_EXPIRY_WARNING_DAYS:
        return None
    ends = status.get("cert_expires_at", "?")
    said = (f"ended at {ends}: no peer accepts it" if days < 0 else
            f"ends at {ends}, in {days} day(s)")
    refused = status.get("cert_files_refused")
    if refused is not None:
        return (f"{said}; the files on disk are refused ({refused}): put a valid pair in "
                f"their place (taken within the hour, no restart)")
    renewed = status.get("cert_renewed_expires_at")  # a build that takes no renewal
    if renewed is not None:
        return f"{said}; a renewed one (ends {renewed}) is on disk: restart the replica"
    return (f"{said}; issue a new one (`cellar certs issue`) into its place: the replica "
            f"takes it within the hour, without a restart")


async def _apply_config(store: GpuStore, args: argparse.Namespace) -> Any:
    return await store.apply_config(args.expected_version, load_spec(args.file))


Action = Callable[[GpuStore, argparse.Namespace], Awaitable[Any]]
ACTIONS: dict[str, tuple[str, Action]] = {
    "apply-config": ("apply a cluster configuration file (TOML or JSON)",
                     _apply_config),
    "cordon": ("no new placements on a node", lambda store, args: store.cordon(args.node)),
    "uncordon": ("undo cordon", lambda store, args: store.uncordon(args.node)),
    "drain": ("cordon and evict every gang on a node",
              lambda store, args: store.drain(args.node)),
    "mark-bad": ("mark a node (or one --gpu) bad",
                 lambda store, args: store.mark_bad(args.node, args.gpu, args.reason)),
    "clear-bad": ("clear an admin mark", lambda store, args: store.clear_bad(args.node,
                                                                            args.gpu)),
    "deregister": ("forget a node's registration (--force: release the gangs on it first)",
                   lambda store, args: store.deregister(args.node, force=args.force)),
    "gangs": ("list every gang", lambda store, args: store.all_gangs(vc=args.vc,
                                                                      phase=args.phase)),
    "gang": ("one gang: placement, phase, why it is pending",
             lambda store, args: store.gang(args.group)),
    "nodes": ("list every node", lambda store, args: store.all_nodes()),
    "node": ("one node with its GPUs and their health", lambda store, args: store.node(
        args.node)),
    "cluster": ("free and bound cells per chain, level and tenant",
                lambda store, args: store.cluster()),
    "stats": ("counts of nodes, GPUs, gangs", lambda store, args: store.stats()),
}


def configure_admin(parser: argparse.ArgumentParser) -> None:
    parser.epilog = ADMIN_EXIT_STATUSES
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_connection_arguments(parser)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, (help_text, _) in ACTIONS.items():
        action = actions.add_parser(name, help=help_text, description=help_text)
        if name == "apply-config":
            action.add_argument("file", type=pathlib.Path)
            action.add_argument("--expected-version", type=at_least(0, most=VERSION_MAX),
                                default=0, help="the configuration version this one replaces")
        if name in ("cordon", "uncordon", "drain", "mark-bad", "clear-bad", "deregister",
                    "node"):
            action.add_argument("node")
        if name == "deregister":
            action.add_argument("--force", action="store_true",
                                help="release the gangs on the node first")
        if name in ("mark-bad", "clear-bad"):
            action.add_argument("--gpu", default="", help="one GPU's UUID (default: all)")
        if name == "mark-bad":
            action.add_argument("--reason", default="admin")
        if name == "gangs":
            action.add_argument("--vc", default="")
            action.add_argument("--phase", default="",
                                choices=[phase.value for phase in GroupPhase],
                                help="only gangs in this phase")
        if name == "gang":
            action.add_argument("group")
    parser.set_defaults(handler=run_admin)


def run_admin(args: argparse.Namespace) -> int:
    try:
        outcome = run_unwrapped(_admin, args)
    except SpecFileError as error:
        print(f"cellar admin: {error}", file=sys.stderr)
        return EXIT_REJECTED
    except ClientError as error:
        return _client_error(error, args.action)
    if isinstance(outcome, Rejection):
        if outcome.code is Code.UNAUTHORIZED:  # ADMIN_EXIT_STATUSES: 4, not 1
            print(f"cellar admin: forbidden: {outcome}", file=sys.stderr)
            return EXIT_FORBIDDEN
        print(f"rejected: {outcome}")
        return EXIT_REJECTED
    plain = outcome if isinstance(outcome, dict) else result_to_plain(outcome)
    print(json.dumps(plain, indent=2, sort_keys=True, default=str))
    return 0


# The actions that apply a command (the others only ask): a command whose answer was too large
# to send ran all the same, applied or rejected, and running it again may apply it twice.
COMMAND_ACTIONS = frozenset({"apply-config", "cordon", "uncordon", "drain", "mark-bad",
                             "clear-bad", "deregister"})


def _client_error(error: ClientError, action: str) -> int:
    """Say what became of the request, and exit with its status (ADMIN_EXIT_STATUSES)."""
    if isinstance(error, ReplyTooLarge) and action in COMMAND_ACTIONS:
        print(f"cellar admin: outcome unknown, it ran (applied or rejected), but its answer "
              f"was too large to send: {error}", file=sys.stderr)
        return EXIT_OUTCOME_UNKNOWN
    status, what = next(((status, what) for kind, status, what in _CLIENT_ERRORS
                         if isinstance(error, kind)), (EXIT_UNREACHABLE, ""))
    print(f"cellar admin: {what}{error}", file=sys.stderr)
    return status


async def _admin(args: argparse.Namespace) -> Any:
    async with client_from(args) as client:
        return await ACTIONS[args.action][1](GpuStore(client), args)
