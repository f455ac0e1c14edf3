"""A replica process's configuration file (TOML), validated before anything starts.

    replica_id = 0
    data_dir = "data/replica-0"
    tick_ms = 10
    loop = "uvloop"              # asyncio | uvloop | trio
    metrics = "127.0.0.1:9400"   # optional Prometheus endpoint
    insecure = false             # plain TCP, for local development only

    [tls]
    ca = "certs/ca.pem"
    cert = "certs/replica-0.pem"
    key = "certs/replica-0.key"

    [[peers]]                    # every replica, this one included
    id = 0
    peer = "127.0.0.1:7000"      # replica-to-replica
    client = "127.0.0.1:7100"    # clients

    [limits]                     # optional; defaults shown in LIMIT_DEFAULTS

Every error names the key and the reason, e.g. `peers[1].client: "localhost" is not
HOST:PORT`, and the process exits before touching its data directory.
"""

from __future__ import annotations

import pathlib
import tomllib
from dataclasses import dataclass
from typing import Any

from consensus.config import REPLICA_COUNT_MAX
from consensus.errors import ConsensusError

LOOPS = ("asyncio", "uvloop", "trio")
LIMIT_DEFAULTS = {
    "inputs_max": 65_536,
    "snapshot_every_slots": 20_000,
    "peer_queue_frames_max": 4096,
    "frame_bytes_max": 8 << 20,
    "client_connections_max": 1024,
    "batch_commands_max": 1024,
    "inflight_instances_max": 512,
}


class NodeConfigError(ConsensusError):
    """The configuration file is missing, unreadable or invalid; the message names the key."""


@dataclass(frozen=True, slots=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class PeerEntry:
    replica_id: int
    peer: Address
    client: Address


@dataclass(frozen=True, slots=True)
class TlsFiles:
    ca: pathlib.Path
    cert: pathlib.Path
    key: pathlib.Path


@dataclass(frozen=True, slots=True)
class NodeConfig:
    replica_id: int
    data_dir: pathlib.Path
    peers: tuple[PeerEntry, ...]
    tls: TlsFiles | None
    insecure: bool
    tick_ms: int
    loop: str
    metrics: Address | None
    limits: dict[str, int]

    @property
    def me(self) -> PeerEntry:
        return next(peer for peer in self.peers if peer.replica_id == self.replica_id)


def load_node_config(path: pathlib.Path) -> NodeConfig:
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise NodeConfigError(f"{path}: cannot read it ({error.strerror})") from error
    except tomllib.TOMLDecodeError as error:
        raise NodeConfigError(f"{path}: not valid TOML ({error})") from error
    return parse_node_config(raw, base=path.parent)


def parse_node_config(raw: dict[str, Any], *, base: pathlib.Path) -> NodeConfig:
    known = {"replica_id", "data_dir", "tick_ms", "loop", "metrics", "insecure", "tls", "peers",
             "limits"}
    for key in sorted(set(raw) - known):
        raise NodeConfigError(f"{key}: unknown key (expected one of {', '.join(sorted(known))})")
    peers = _peers(raw.get("peers"))
    replica_id = _integer(raw, "replica_id", 0, REPLICA_COUNT_MAX - 1)
    if replica_id not in {peer.replica_id for peer in peers}:
        raise NodeConfigError(f"replica_id: {replica_id} is not among the peers' ids")
    insecure = raw.get("insecure", False)
    if not isinstance(insecure, bool):
        raise NodeConfigError("insecure: must be true or false")
    tls = None if insecure else _tls(raw.get("tls"), base)
    loop = raw.get("loop", "uvloop")
    if loop not in LOOPS:
        raise NodeConfigError(f"loop: {loop!r} is not one of {', '.join(LOOPS)}")
    return NodeConfig(
        replica_id=replica_id, data_dir=base / _text(raw, "data_dir"), peers=peers, tls=tls,
        insecure=insecure, tick_ms=_integer(raw, "tick_ms", 1, 1000, default=10), loop=loop,
        metrics=_address(raw["metrics"], "metrics") if "metrics" in raw else None,
        limits=_limits(raw.get("limits", {})),
    )


def _text(raw: dict[str, Any], key: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not value:
        raise NodeConfigError(f"{key}: required, a non-empty string")
    return value


def _integer(raw: dict[str, Any], key: str, low: int, high: int, *,
             default: int | None = None) -> int:
    value = raw.get(key, default)
    if type(value) is not int:
        raise NodeConfigError(f"{key}: required, an integer")
    if not low <= value <= high:
        raise NodeConfigError(f"{key}: {value} is outside [{low}, {high}]")
    return value


def _address(value: Any, key: str) -> Address:
    if not isinstance(value, str) or value.count(":") < 1:
        raise NodeConfigError(f"{key}: {value!r} is not HOST:PORT")
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise NodeConfigError(f"{key}: {value!r} is not HOST:PORT with a port in 1..65535")
    return Address(host.strip("[]"), int(port))


def _peers(value: Any) -> tuple[PeerEntry, ...]:
    if not isinstance(value, list) or not value:
        raise NodeConfigError("peers: required, a list of [[peers]] tables (every replica)")
    entries = []
    for index, item in enumerate(value):
        where = f"peers[{index}]"
        if not isinstance(item, dict):
            raise NodeConfigError(f"{where}: must be a table with id, peer and client")
        entries.append(PeerEntry(_integer(item, "id", 0, REPLICA_COUNT_MAX - 1),
                                 _address(item.get("peer"), f"{where}.peer"),
                                 _address(item.get("client"), f"{where}.client")))
    ids = sorted(entry.replica_id for entry in entries)
    if ids != list(range(len(entries))):
        raise NodeConfigError(f"peers: ids must be 0..{len(entries) - 1}, each once; got {ids}")
    if len(entries) % 2 == 0 or len(entries) < 3:
        raise NodeConfigError(f"peers: {len(entries)} replicas; use an odd number, at least 3")
    return tuple(sorted(entries, key=lambda entry: entry.replica_id))


def _tls(value: Any, base: pathlib.Path) -> TlsFiles:
    if not isinstance(value, dict):
        raise NodeConfigError("tls: required unless insecure = true (a table with ca, cert, "
                              "key); make them with `cellar certs init`")
    files = {}
    for key in ("ca", "cert", "key"):
        name = value.get(key)
        if not isinstance(name, str):
            raise NodeConfigError(f"tls.{key}: required, a file path")
        path = base / name
        if not path.is_file():
            raise NodeConfigError(f"tls.{key}: {path} does not exist")
        files[key] = path
    return TlsFiles(files["ca"], files["cert"], files["key"])


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
        limits[key] = number
    return limits
