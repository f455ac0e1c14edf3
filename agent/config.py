"""The node agent's configuration file (TOML), validated before anything starts.

    node = "gpu-node-17"             # this node's id in the cluster configuration
    store = ["10.0.0.1:7100", "10.0.0.2:7100", "10.0.0.3:7100"]   # replicas' client ports
    state_dir = "/var/lib/cellar-agent"   # the job ledger and job logs (relative: to this file)
    metrics = "0.0.0.0:9400"         # optional Prometheus endpoint (dcgm-exporter's names)
    loop = "uvloop"                  # asyncio | uvloop | trio
    backend = "nvml"                 # or "fake:h100-8" (and other fake profiles) for trials
    insecure = false                 # plain TCP, for local development only

    [tls]                            # `cellar certs issue DIR --node gpu-node-17`
    ca = "certs/ca.pem"
    cert = "certs/node-gpu-node-17.pem"
    key = "certs/node-gpu-node-17.key"

    [intervals]                      # all optional
    heartbeat_ms = 2000              # past 5000 (half the store's default lease_ms): a warning
    poll_ms = 5000                   # health counters
    event_wait_ms = 1000             # one wait for XID events
    retry_ms_max = 10000             # back-off ceiling while NVML or the store is away (past
                                     # 10000, half the store's default down_after_ms: a warning)

    [jobs]
    jobs_max = 256
    grace_ms = 10000                 # SIGTERM, then SIGKILL after this
    gpu_release_timeout_ms = 30000   # wait for NVML to show the job's processes gone
    log_bytes_max = 16777216         # a running job's log past this is cut, its tail kept

    [models]                         # NVML model name -> the model name the cluster uses
    "NVIDIA H100 80GB HBM3" = "H100"

    [health]                         # XID lists and thresholds: agent.health_policy's fields
    application_xids = [13, 31, 43, 45, 68, 109]

The certificate must name this node (`cellar://node/<node>`): the store lets a node agent act
for its own node only. Every error names the key and the reason.
"""

from __future__ import annotations

import logging
import pathlib
from dataclasses import dataclass, field
from typing import Any

from agent.health_policy import HealthPolicy, PolicyError
from agent.job_limits import JobLimits
from agent.units import MIB
from consensus.runtime.config_fields import (
    Address,
    ConfigError,
    TlsFiles,
    address,
    choice,
    integer,
    load_toml,
    refuse_unknown,
    security,
    text,
)
from statemachine.spec import PolicySpec

logger = logging.getLogger("cellar.agent.config")

LOOPS = ("asyncio", "uvloop", "trio")
MS_MAX = 3_600_000
# One job's log: at least the tail a cut keeps (JobLimits.log_tail_bytes), at most 1 TiB.
LOG_BYTES_RANGE = (MIB, 1024 * 1024 * MIB)
# The store's default lease (PolicySpec): a node without a heartbeat for lease_ms is Suspect,
# down_after_ms later Down (its GPUs failed). An agent cannot read the cluster's policy (one may
# have raised it), so intervals past these margins of the defaults are warned of, not refused:
# a heartbeat past half the lease, a back-off ceiling past half the Suspect grace (after a store
# outage its heartbeat would land after the node was judged Down; see Intervals.retry_ms_max).
STORE_POLICY_DEFAULT = PolicySpec()
INTERVALS_MS_WARN = {"heartbeat_ms": STORE_POLICY_DEFAULT.lease_ms // 2,
                     "retry_ms_max": STORE_POLICY_DEFAULT.down_after_ms // 2}
KEYS = {"node", "store", "state_dir", "metrics", "loop", "backend", "insecure", "tls",
        "intervals", "jobs", "models", "health"}


class AgentConfigError(ConfigError):
    """The agent's configuration file is missing, unreadable or invalid."""


@dataclass(frozen=True, slots=True)
class Intervals:
    heartbeat_ms: int = 2000
    poll_ms: int = 5000
    event_wait_ms: int = 1000
    # Below the store's default down_after_ms (20 s): after a store outage, every agent's
    # heartbeat lands within the Suspect grace of the first Tick that judges the leases.
    retry_ms_max: int = 10_000


@dataclass(frozen=True, slots=True)
class AgentConfig:
    node: str
    store: tuple[Address, ...]
    state_dir: pathlib.Path
    tls: TlsFiles | None
    insecure: bool = False
    metrics: Address | None = None
    loop: str = "uvloop"
    backend: str = "nvml"
    intervals: Intervals = field(default_factory=Intervals)
    jobs: JobLimits = field(default_factory=JobLimits)
    models: tuple[tuple[str, str], ...] = ()  # NVML name -> cluster model name
    health: HealthPolicy = field(default_factory=HealthPolicy)

    @property
    def endpoints(self) -> list[str]:
        return [str(entry) for entry in self.store]


def load_agent_config(path: pathlib.Path) -> AgentConfig:
    return parse_agent_config(load_toml(path, AgentConfigError), base=path.parent)


def parse_agent_config(raw: dict[str, Any], *, base: pathlib.Path) -> AgentConfig:
    refuse_unknown(raw, KEYS, error=AgentConfigError)
    insecure, tls = security(raw, base, AgentConfigError)
    loop = choice(raw, "loop", LOOPS, default="uvloop", error=AgentConfigError)
    return AgentConfig(
        node=text(raw, "node", error=AgentConfigError),
        store=_store(raw.get("store")),
        state_dir=base / text(raw, "state_dir", error=AgentConfigError),
        tls=tls,
        insecure=insecure,
        metrics=address(raw["metrics"], "metrics", AgentConfigError) if "metrics" in raw
        else None,
        loop=loop, backend=_backend(raw),
        intervals=_intervals(_table(raw, "intervals")), jobs=_jobs(_table(raw, "jobs")),
        models=_models(_table(raw, "models")), health=_health(_table(raw, "health")))


def _table(raw: dict[str, Any], key: str) -> dict[str, Any]:
    value = raw.get(key, {})
    if not isinstance(value, dict):
        raise AgentConfigError(f"{key}: must be a table")
    return value


def _store(value: Any) -> tuple[Address, ...]:
    if not isinstance(value, list) or not value:
        raise AgentConfigError("store: required, a list of the replicas' client addresses")
    return tuple(address(item, f"store[{index}]", AgentConfigError)
                 for index, item in enumerate(value))


def _backend(raw: dict[str, Any]) -> str:
    backend = text(raw, "backend", default="nvml", error=AgentConfigError)
    if backend != "nvml" and not backend.startswith("fake:"):
        raise AgentConfigError(f"backend: {backend!r} is neither \"nvml\" nor \"fake:PROFILE\"")
    return backend


def _intervals(raw: dict[str, Any]) -> Intervals:
    refuse_unknown(raw, set(Intervals.__dataclass_fields__), "intervals.", AgentConfigError)
    defaults = Intervals()
    intervals = Intervals(**{name: integer(raw, name, 10, MS_MAX, where="intervals.",
                                           default=getattr(defaults, name),
                                           error=AgentConfigError)
                             for name in Intervals.__dataclass_fields__})
    for name, warn_ms in INTERVALS_MS_WARN.items():
        if getattr(intervals, name) > warn_ms:
            logger.warning("intervals.%s = %d is past %d ms, a margin of the store's default "
                           "lease (lease_ms %d, down_after_ms %d): with the default policy the "
                           "node may be judged Down while this agent is well", name,
                           getattr(intervals, name), warn_ms, STORE_POLICY_DEFAULT.lease_ms,
                           STORE_POLICY_DEFAULT.down_after_ms)
    return intervals


def _jobs(raw: dict[str, Any]) -> JobLimits:
    refuse_unknown(raw, {"jobs_max", "grace_ms", "gpu_release_timeout_ms", "log_bytes_max"},
                   "jobs.", AgentConfigError)
    defaults = JobLimits()

    def seconds(key: str, default_s: float) -> float:
        return integer(raw, key, 0, MS_MAX, where="jobs.", default=round(default_s * 1000),
                       error=AgentConfigError) / 1000

    jobs_max = integer(raw, "jobs_max", 1, 65_536, where="jobs.", default=defaults.jobs_max,
                       error=AgentConfigError)
    log_bytes_max = integer(raw, "log_bytes_max", *LOG_BYTES_RANGE, where="jobs.",
                            default=defaults.log_bytes_max, error=AgentConfigError)
    return JobLimits(jobs_max=jobs_max, logs_kept_max=max(defaults.logs_kept_max, jobs_max),
                     log_bytes_max=log_bytes_max,
                     grace_s=seconds("grace_ms", defaults.grace_s),
                     gpu_release_timeout_s=seconds("gpu_release_timeout_ms",
                                                   defaults.gpu_release_timeout_s)).validate()


def _health(raw: dict[str, Any]) -> HealthPolicy:
    try:
        return HealthPolicy.from_mapping(raw)
    except PolicyError as error:
        raise AgentConfigError(f"health.{error.key}: {error}") from error


def _models(raw: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    for name, model in raw.items():
        if name in KEYS:  # TOML puts every key after [models] into it
            raise AgentConfigError(f"models.{name!r}: a top-level key written below [models]; "
                                   "move it above the first table")
        if not isinstance(model, str) or not model:
            raise AgentConfigError(f"models.{name!r}: must name a GPU model of the cluster "
                                   "configuration")
    return tuple(sorted(raw.items()))


def cluster_model(nvml_name: str, models: tuple[tuple[str, str], ...]) -> str:
    """The model name the cluster configuration uses for a GPU NVML calls `nvml_name`: the
    [models] table's entry, else the name's first word after the vendor and family words
    ("NVIDIA A100-SXM4-80GB" -> "A100", "NVIDIA H100 80GB HBM3" -> "H100")."""
    mapped = dict(models).get(nvml_name)
    if mapped is not None:
        return mapped
    words = [word for word in nvml_name.split() if word not in ("NVIDIA", "Tesla", "GeForce")]
    return words[0].split("-")[0] if words else nvml_name
