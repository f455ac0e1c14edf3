"""A replica process's configuration file (TOML), validated before anything starts.

    replica_id = 0
    data_dir = "data/replica-0"
    tick_ms = 10                 # the same on every replica (below)
    idle_wake_ticks = 4          # with no input, wake every 4 ticks (1: every tick)
    loop = "uvloop"              # asyncio | uvloop | trio
    machine = "gpu"              # gpu (the GPU-allocation store) | kv (a plain key-value store)
    sync = true                  # false: not fsynced before acknowledging (benchmarks only)
    metrics = "127.0.0.1:9400"   # optional Prometheus endpoint
    insecure = false             # plain TCP, for local development only
    defects = []                 # deliberate protocol faults: only to test the harness

    [tls]
    ca = "certs/ca.pem"
    cert = "certs/replica-0.pem"
    key = "certs/replica-0.key"

    [[peers]]                    # every replica, this one included
    id = 0
    peer = "127.0.0.1:7000"      # replica-to-replica
    client = "127.0.0.1:7100"    # clients

    [limits]                     # optional; defaults shown in LIMIT_DEFAULTS

`tick_ms` must be the same on every replica: the read lease is counted in ticks by the
sequencer and its followers each, with a margin (`lease_drift_ticks` of `lease_ticks`,
consensus/config.py) that covers one tick of rounding and clocks whose rates differ by up to
7.5 %, not ticks of different lengths. Peers exchange their values when they connect and refuse
each other where they differ (consensus/runtime/peers.py).

A limit below its floor in LIMIT_MINIMUMS is refused: the peer mesh drops a frame over
`frame_bytes_max`, so a cap below the largest frame the protocol builds (a catch-up reply)
would leave a lagging replica asking for ever, and a byte budget below one valid request
(`proposal_bytes_max`, `watch_bytes_max`) would refuse it OVERLOADED at every try.

`insecure = true` beside a `[tls]` table is refused, as `tls.check_security` refuses the pair:
the table was dropped without a word and the replica served plain TCP to an operator who had
written where its certificates are.

Every error names the key and the reason, e.g. `peers[1].client: "localhost" is not
HOST:PORT`, and the process exits before touching its data directory. The TLS files are loaded
as the listeners will by `check_tls_files` (a replica calls it before opening its log), so a key
that does not match its certificate is named there, not met as `[SSL] PEM lib` once running.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass
from typing import Any

from consensus.catchup import FETCH_REPLY_BYTES_MAX
from consensus.codec import BATCH_COMMANDS_MAX, ENVELOPE_BYTES_MAX, MESSAGE_BYTES_MAX
from consensus.config import REPLICA_COUNT_MAX, Defect
from consensus.envelope import BODY_BYTES_MAX
from consensus.runtime.certs import identity_in_file
from consensus.runtime.config_fields import (
    Address,
    ConfigError,
    TlsFiles,
    address,
    choice,
    flag,
    integer,
    load_toml,
    refuse_unknown,
    security,
    text,
)
from consensus.runtime.driver import DriverConfig
from consensus.runtime.tls import Identity, IdentityRefused, TlsConfig, TlsFileRefused
from consensus.runtime.watch_budget import PRINCIPAL_SHARE

__all__ = ["Address", "NodeConfig", "NodeConfigError", "PeerEntry", "TlsFiles",
           "check_tls_files", "load_node_config", "load_peers", "parse_node_config"]

LOOPS = ("asyncio", "uvloop", "trio")
MACHINES = ("gpu", "kv")
_DRIVER = DriverConfig()  # the driver's limits default to its own defaults, written once
LIMIT_DEFAULTS = {
    "inputs_max": _DRIVER.inputs_max,
    "snapshot_every_slots": _DRIVER.snapshot_every_slots,
    # of commands: the log a snapshot lets go, at most
    "snapshot_every_bytes": _DRIVER.snapshot_every_bytes,
    "peer_queue_frames_max": 4096,
    "frame_bytes_max": 8 << 20,
    "client_connections_max": 1024,
    "batch_commands_max": 1024,
    "inflight_instances_max": 512,
    # client commands held and not yet executed
    "proposal_bytes_max": _DRIVER.proposal_bytes_max,
    # watches' queries while they wait (watch_budget.py)
    "watch_bytes_max": _DRIVER.watch_bytes_max,
}
# A budget below one valid request refuses it OVERLOADED at every try, for ever, its budget
# empty: the client retries its whole deadline and says no replica took it. So the proposal
# budget takes the largest command, and a principal's share of the watches' budget (an eighth,
# watch_budget.py) the largest query.
LIMIT_MINIMUMS = {"frame_bytes_max": FETCH_REPLY_BYTES_MAX,
                  "proposal_bytes_max": ENVELOPE_BYTES_MAX,
                  "watch_bytes_max": PRINCIPAL_SHARE * BODY_BYTES_MAX}
# A C-instance with more commands decodes nowhere: not at the peers, not from the replica's
# own log at its next start. A frame larger than the codec's cap no client reads (it drops the
# connection instead of getting TOO_LARGE).
LIMIT_MAXIMUMS = {"batch_commands_max": BATCH_COMMANDS_MAX, "frame_bytes_max": MESSAGE_BYTES_MAX}


class NodeConfigError(ConfigError):
    """The configuration file is missing, unreadable or invalid; the message names the key."""


@dataclass(frozen=True, slots=True)
class PeerEntry:
    replica_id: int
    peer: Address
    client: Address


@dataclass(frozen=True, slots=True)
class NodeConfig:
    replica_id: int
    data_dir: pathlib.Path
    peers: tuple[PeerEntry, ...]
    tls: TlsFiles | None
    insecure: bool
    tick_ms: int
    idle_wake_ticks: int
    loop: str
    machine: str
    sync: bool  # False: acknowledged writes can be lost on a power failure (benchmarks only)
    metrics: Address | None
    limits: dict[str, int]
    # Deliberate protocol faults (consensus.config.Defect), only for showing that the harness
    # catches them (`cellar live --defect`); the replica warns at start. Never in production.
    defects: tuple[Defect, ...] = ()

    @property
    def me(self) -> PeerEntry:
        return next(peer for peer in self.peers if peer.replica_id == self.replica_id)


def load_node_config(path: pathlib.Path) -> NodeConfig:
    return parse_node_config(load_toml(path, NodeConfigError), base=path.parent)


def load_peers(path: pathlib.Path) -> tuple[PeerEntry, ...]:
    """The `[[peers]]` of a replica's file alone: what `cellar status --config` and `cellar
    admin --config` need, run where the replica's own certificate and key are not (an
    administrator's machine), which `load_node_config` requires to exist."""
    return _peers(load_toml(path, NodeConfigError).get("peers"))


def check_tls_files(config: NodeConfig) -> None:
    """Load the TLS files as the replica's listeners will; NodeConfigError naming the key and
    the file if one cannot serve (a key not matching its certificate, a file that is not a
    key, one that cannot be read) or the certificate names another identity than this
    replica (a file copied from another replica's). A replica calls it before touching its
    data directory; the loader does not, for commands that read a replica's file only for
    its addresses."""
    if config.tls is None:
        return
    try:
        TlsConfig(ca_file=config.tls.ca, cert_file=config.tls.cert,
                  key_file=config.tls.key).check()
        identity = identity_in_file(config.tls.cert)
    except TlsFileRefused as refused:
        raise NodeConfigError(f"tls.{refused.field}: {refused}") from refused
    except (IdentityRefused, ValueError) as refused:  # ValueError: an extension unreadable
        raise NodeConfigError(f"tls.cert: {config.tls.cert}: {refused}") from refused
    if identity != Identity.replica(config.replica_id):
        # Its peers would take it for the replica the certificate names, and drop that one.
        raise NodeConfigError(f"tls.cert: {config.tls.cert} names {identity}, not "
                              f"{Identity.replica(config.replica_id)}")


def parse_node_config(raw: dict[str, Any], *, base: pathlib.Path) -> NodeConfig:
    refuse_unknown(raw, {"replica_id", "data_dir", "tick_ms", "idle_wake_ticks", "loop",
                         "metrics", "insecure", "machine", "sync", "tls", "peers", "limits",
                         "defects"},
                   error=NodeConfigError)
    peers = _peers(raw.get("peers"))
    replica_id = integer(raw, "replica_id", 0, REPLICA_COUNT_MAX - 1, error=NodeConfigError)
    if replica_id not in {peer.replica_id for peer in peers}:
        raise NodeConfigError(f"replica_id: {replica_id} is not among the peers' ids")
    insecure, tls = security(raw, base, NodeConfigError)
    loop = choice(raw, "loop", LOOPS, default="uvloop", error=NodeConfigError)
    machine = choice(raw, "machine", MACHINES, default="gpu", error=NodeConfigError)
    metrics = address(raw["metrics"], "metrics", NodeConfigError) if "metrics" in raw else None
    if metrics is not None and metrics in {address for peer in peers
                                           for address in (peer.peer, peer.client)}:
        raise NodeConfigError(f"metrics: {metrics} is also a peer or client address")
    return NodeConfig(
        replica_id=replica_id, data_dir=base / text(raw, "data_dir", error=NodeConfigError),
        peers=peers, tls=tls, insecure=insecure,
        tick_ms=integer(raw, "tick_ms", 1, 1000, default=10, error=NodeConfigError),
        idle_wake_ticks=integer(raw, "idle_wake_ticks", 1, 100, default=4,
                                error=NodeConfigError), loop=loop,
        machine=machine, sync=flag(raw, "sync", default=True, error=NodeConfigError),
        metrics=metrics,
        limits=_limits(raw.get("limits", {})),
        defects=_defects(raw.get("defects", [])),
    )


def _defects(value: Any) -> tuple[Defect, ...]:
    names = [defect.value for defect in Defect]
    if not isinstance(value, list) or any(item not in names for item in value):
        raise NodeConfigError(f"defects: a list of deliberate faults among {names}")
    return tuple(Defect(item) for item in value)


def _peers(value: Any) -> tuple[PeerEntry, ...]:
    if not isinstance(value, list) or not value:
        raise NodeConfigError("peers: required, a list of [[peers]] tables (every replica)")
    entries = []
    for index, item in enumerate(value):
        where = f"peers[{index}]"
        if not isinstance(item, dict):
            raise NodeConfigError(f"{where}: must be a table with id, peer and client")
        # A top-level key written below the [[peers]] tables lands in the last one: refused
        # by name rather than dropped without a word.
        refuse_unknown(item, {"id", "peer", "client"}, f"{where}.", NodeConfigError)
        entries.append(PeerEntry(
            integer(item, "id", 0, REPLICA_COUNT_MAX - 1, where=f"{where}.",
                    error=NodeConfigError),
            address(item.get("peer"), f"{where}.peer", NodeConfigError),
            address(item.get("client"), f"{where}.client", NodeConfigError)))
    seen: dict[Address, str] = {}
    for index, entry in enumerate(entries):  # one listener each: a repeat cannot be served
        for kind, where_to in (("peer", entry.peer), ("client", entry.client)):
            key = f"peers[{index}].{kind}"
            if where_to in seen:
                raise NodeConfigError(f"{key}: {where_to} is also {seen[where_to]}")
            seen[where_to] = key
    ids = sorted(entry.replica_id for entry in entries)
    if ids != list(range(len(entries))):
        raise NodeConfigError(f"peers: ids must be 0..{len(entries) - 1}, each once; got {ids}")
    if len(entries) % 2 == 0 or len(entries) < 3:
        raise NodeConfigError(f"peers: {len(entries)} replicas; use an odd number, at least 3")
    return tuple(sorted(entries, key=lambda entry: entry.replica_id))


def _limits(value: Any) -> dict[str, int]:
    if not isinstance(value, dict):
        raise NodeConfigError("limits: must be a table")
    limits = dict(LIMIT_DEFAULTS)
    for key, number in value.items():
        if key not in LIMIT_DEFAULTS:
            raise NodeConfigError(f"limits.{key}: unknown limit (known: "
                                  f"{', '.join(sorted(LIMIT_DEFAULTS))})")
        if type(number) is not int or number <= 0:
            raise NodeConfigError(f"limits.{key}: must be a positive integer")
        if number < LIMIT_MINIMUMS.get(key, 1):
            raise NodeConfigError(f"limits.{key}: {number} is below its floor of "
                                  f"{LIMIT_MINIMUMS[key]}")
        if number > LIMIT_MAXIMUMS.get(key, number):
            raise NodeConfigError(f"limits.{key}: {number} is above its ceiling of "
                                  f"{LIMIT_MAXIMUMS[key]}")
        limits[key] = number
    return limits
