"""What the README and docs/*.md say is what the code does, where a machine can tell.

Every `cellar ...` command line they show parses: its subcommand and flags exist (a guard, so a
renamed flag cannot leave the docs behind); every repository path the README names in backticks
exists; the replica and agent files the README shows, and the examples atop `node_config` and
`agent.config` (to which it sends readers for every key and its default), parse, and the
defaults they show are the code's; every exit status the README names is the constant the code
returns, and the `--help` lists of `cellar status` and `cellar admin` hold exactly those; the
limits the README quotes in its prose are built here from the constants in code."""

from __future__ import annotations

import pathlib
import re
import shlex
import textwrap
import tomllib
import types
from typing import Any

import pytest

from agent import config as agent_config
from agent.config import Intervals, parse_agent_config
from agent.health_policy import HealthPolicy
from agent.job_limits import JobLimits
from cellar import daemon_process, ops_cli
from cellar.cli import build_parser
from cellar.kv.codec import DATA_BYTES_MAX, KEYS_MAX
from cellar.live import command as live_command
from consensus.config import REPLICA_COUNT_MAX, ReplicaConfig
from consensus.runtime import node_config, storage_errors
from consensus.runtime.handshake_guard import HANDSHAKE_FAILURE_WINDOW_S, HANDSHAKE_FAILURES_MAX
from consensus.runtime.listener import ADMIN_CONNECTIONS_RESERVED
from consensus.runtime.node_config import LIMIT_DEFAULTS, parse_node_config
from consensus.runtime.proposal_budget import NODE_RESERVED_BYTES, NODE_RESERVED_COMMANDS
from consensus.runtime.server import SENT_MS_SLACK_MS
from consensus.runtime.watch_budget import WATCHES_PER_PRINCIPAL_MAX
from jepsen import check_cli
from jepsen.sim import cli as sim_cli
from statemachine.commands import HealthStatus
from statemachine.limits import (
    GROUPS_MAX,
    SESSION_REPLIES_BYTES_MAX,
    SESSION_TTL_MS_MIN,
    STAMP_LEAD_MS_MAX,
)
from statemachine.sessions import STAMP_WINDOW_MS

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def documented_commands() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        for block in re.findall(r"```sh\n(.*?)```", doc.read_text(encoding="utf-8"), re.S):
            for raw in block.replace("\\\n", " ").splitlines():
                line = raw.split("#", 1)[0].strip()
                if line.startswith(".venv/bin/cellar "):
                    found.append((doc.name, line.removeprefix(".venv/bin/cellar ")))
    return found


@pytest.mark.parametrize(("doc", "line"), documented_commands())
def test_a_documented_command_line_parses(doc: str, line: str) -> None:
    args, unknown = build_parser().parse_known_args(shlex.split(line))
    assert unknown == [], f"{doc}: `cellar {line}`: unknown {unknown}"
    assert callable(args.handler)


def test_the_docs_show_command_lines() -> None:
    assert len(documented_commands()) >= 20


def test_the_paths_the_readme_names_exist() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`((?:consensus|statemachine|agent|jepsen|cellar|tests|docs|examples)"
                           r"/[A-Za-z0-9_./-]*)`", text))
    assert named
    assert sorted(path for path in named if not (ROOT / path).exists()) == []


# --- configuration files the docs show -------------------------------------------------------

def toml_blocks(text: str) -> list[dict[str, Any]]:
    return [tomllib.loads(block) for block in re.findall(r"```toml\n(.*?)```", text, re.S)]


def docstring_example(module: types.ModuleType) -> dict[str, Any]:
    """The TOML example indented at the top of a module's docstring."""
    assert module.__doc__ is not None
    block = re.search(r"\n\n((?:    .*\n|\n)+)", module.__doc__)
    assert block is not None
    return tomllib.loads(textwrap.dedent(block.group(1)))


def with_tls_files(raw: dict[str, Any], base: pathlib.Path) -> dict[str, Any]:
    """`raw`, whose `[tls]` files now exist under `base` (empty: only their presence is
    checked when a file is parsed)."""
    for relative in raw.get("tls", {}).values():
        (base / relative).parent.mkdir(parents=True, exist_ok=True)
        (base / relative).touch()
    return raw


def three_peers(raw: dict[str, Any]) -> dict[str, Any]:
    """The docs show one `[[peers]]` table "per replica"; a file needs 3 or more."""
    shown = raw["peers"]
    host = str(shown[0]["peer"]).rpartition(":")[0]
    extra = [{"id": index, "peer": f"{host}:{7000 + index}", "client": f"{host}:{7100 + index}"}
             for index in range(len(shown), 3)]
    return {**raw, "peers": [*shown, *extra]}


README_TOML = toml_blocks((ROOT / "README.md").read_text(encoding="utf-8"))


def test_the_readme_replica_file_parses_and_shows_the_default_limits(
        tmp_path: pathlib.Path) -> None:
    """README's replica file: every key exists (a file with an unknown key is refused), every
    value is valid, and the `[limits]` it shows are the defaults."""
    (raw,) = [block for block in README_TOML if "replica_id" in block]
    config = parse_node_config(with_tls_files(three_peers(raw), tmp_path), base=tmp_path)
    assert config.limits == LIMIT_DEFAULTS
    assert {key: LIMIT_DEFAULTS[key] for key in raw["limits"]} == raw["limits"]


def test_the_readme_agent_file_parses(tmp_path: pathlib.Path) -> None:
    (raw,) = [block for block in README_TOML if "state_dir" in block]
    config = parse_agent_config(with_tls_files(raw, tmp_path), base=tmp_path)
    assert config.health.application_xids == frozenset(raw["health"]["application_xids"])


@pytest.mark.parametrize("module", [node_config, agent_config], ids=lambda module: module.__name__)
def test_a_config_modules_example_parses_with_the_defaults_it_names(
        module: types.ModuleType, tmp_path: pathlib.Path) -> None:
    """The example at the top of `node_config` and `agent.config` ("every key and its
    default", as the README sends readers there) parses; the values it shows are the defaults
    (`data_dir`, `node`, `store`, addresses and `[tls]` have none)."""
    raw = with_tls_files(docstring_example(module), tmp_path)
    if module is node_config:
        parsed = parse_node_config(three_peers(raw), base=tmp_path)
        defaults = parse_node_config(three_peers({"replica_id": 0, "data_dir": "d", "peers":
                                                  raw["peers"], "tls": raw["tls"]}),
                                     base=tmp_path)
        shown = {key: value for key, value in raw.items()
                 if key in ("tick_ms", "idle_wake_ticks", "loop", "machine", "sync",
                            "insecure", "defects")}
        assert {key: getattr(defaults, key) if key != "defects" else list(defaults.defects)
                for key in shown} == shown
        assert parsed.limits == LIMIT_DEFAULTS
    else:
        parsed_agent = parse_agent_config(raw, base=tmp_path)
        assert parsed_agent.intervals == agent_config.Intervals(**raw["intervals"])
        defaults_agent = parse_agent_config(
            {"node": "n", "store": raw["store"], "state_dir": "s", "tls": raw["tls"]},
            base=tmp_path)
        assert parsed_agent.intervals == defaults_agent.intervals
        assert parsed_agent.jobs == defaults_agent.jobs
        assert parsed_agent.health == defaults_agent.health
        assert (parsed_agent.loop, parsed_agent.backend, parsed_agent.insecure) == (
            defaults_agent.loop, defaults_agent.backend, defaults_agent.insecure)


# --- exit statuses the docs name -------------------------------------------------------------

README_PROSE = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())

# (a phrase of the README that follows an exit status, the constant the code returns for it)
DOCUMENTED_EXIT_STATUSES: list[tuple[str, int]] = [
    # cellar status
    ("fewer did", ops_cli.EXIT_NO_MAJORITY),
    ("none did", ops_cli.EXIT_UNREACHABLE),
    ("a command line it cannot parse", ops_cli.EXIT_USAGE),
    ("a configuration file or certificate it cannot use", ops_cli.EXIT_CONFIG),
    # cellar admin
    ("rejected by the state machine (nothing changed) or a bad file", ops_cli.EXIT_REJECTED),
    ("no replica reached in time", ops_cli.EXIT_UNREACHABLE),
    ("outcome unknown (the command may have been applied", ops_cli.EXIT_OUTCOME_UNKNOWN),
    ("forbidden to this identity", ops_cli.EXIT_FORBIDDEN),
    ("refused by the replica (a malformed request", ops_cli.EXIT_REFUSED),
    # cellar check
    ("linearizable, 1 not linearizable", check_cli.EXIT_LINEARIZABLE),
    ("not linearizable, 2 unknown", check_cli.EXIT_NOT_LINEARIZABLE),
    ("unknown (the `--timeout`", check_cli.EXIT_UNKNOWN),
    ("nothing was checked", check_cli.EXIT_UNREADABLE),
    # cellar sim
    ("a violation found, 2 no violation", sim_cli.EXIT_VIOLATION),
    ("no violation but some history's check ran out", sim_cli.EXIT_UNCHECKED),
    ("a usage error (a `--seeds` range", sim_cli.EXIT_USAGE),
    # cellar live
    ("no verdict (the checker ran out", live_command.EXIT_NO_VERDICT),
    ("bad arguments, or the cluster never started", live_command.EXIT_USAGE),
    # cellar replica
    ("no such directory, or no log in it", storage_errors.EXIT_DATA_DIRECTORY_MISSING),
    ("another process holds the directory", storage_errors.EXIT_DATA_DIRECTORY_LOCKED),
    ("the log is damaged somewhere a crash cannot explain", storage_errors.EXIT_LOG_CORRUPT),
    ("a log format this build does not read", storage_errors.EXIT_LOG_VERSION_UNSUPPORTED),
    ("a write or fsync failed", storage_errors.EXIT_STORAGE_FAILED),
    ("the directory is another replica's", storage_errors.EXIT_DATA_DIRECTORY_MISMATCH),
    ("for a bad file or value", daemon_process.EXIT_CONFIG),
]


@pytest.mark.parametrize(("phrase", "status"), DOCUMENTED_EXIT_STATUSES)
def test_an_exit_status_the_readme_names_is_the_codes(phrase: str, status: int) -> None:
    """README says `<status> <phrase>` (or `<status>: <phrase>`); the code's constant agrees."""
    found = re.findall(rf"(\d+):? {re.escape(phrase)}", README_PROSE)
    assert found, f"README no longer says {phrase!r}"
    assert {int(number) for number in found} == {status}


def test_listening_failures_and_a_bad_file_exit_as_the_readme_says() -> None:
    assert f"exits {daemon_process.EXIT_UNAVAILABLE} once the log is open" in README_PROSE
    assert f"{daemon_process.EXIT_CONFIG} for a bad file or value" in README_PROSE


@pytest.mark.parametrize(("epilog", "statuses"), [
    (ops_cli.STATUS_EXIT_STATUSES, {0, ops_cli.EXIT_NO_MAJORITY, ops_cli.EXIT_UNREACHABLE,
                                    ops_cli.EXIT_USAGE, ops_cli.EXIT_CONFIG}),
    (ops_cli.ADMIN_EXIT_STATUSES, {0, ops_cli.EXIT_REJECTED, ops_cli.EXIT_UNREACHABLE,
                                   ops_cli.EXIT_OUTCOME_UNKNOWN, ops_cli.EXIT_FORBIDDEN,
                                   ops_cli.EXIT_REFUSED}),
], ids=["status", "admin"])
def test_the_exit_statuses_a_help_lists_are_the_codes(epilog: str, statuses: set[int]) -> None:
    """`cellar status --help` and `cellar admin --help` list each status the code returns."""
    listed = {int(number) for number in re.findall(r"^  (\d+) ", epilog, re.M)}
    assert listed == statuses


# --- limits the README quotes in its prose ---------------------------------------------------

def _policy_default(name: str) -> object:
    return ReplicaConfig.__dataclass_fields__[name].default


DOCUMENTED_LIMITS: list[str] = [
    f"an odd number, 3 to {REPLICA_COUNT_MAX}",
    f"the client's send time plus {SENT_MS_SLACK_MS // 1000} s",
    f"at most {GROUPS_MAX:,} gangs held",
    f"more than {STAMP_WINDOW_MS // 1000} s ago (half the shortest lifetime a policy may set, "
    f"{SESSION_TTL_MS_MIN // 60_000} minutes)",
    f"Past {SESSION_REPLIES_BYTES_MAX >> 20} MiB of cached replies",
    f"at most {STAMP_LEAD_MS_MAX // 1000} s past the latest Tick's stamp",
    f"holds at most {DATA_BYTES_MAX >> 20} MiB of keys and values",
    f"and {KEYS_MAX:,} keys",
    f"counted in ticks ({_policy_default('lease_ticks')}, less a margin of "
    f"{_policy_default('lease_drift_ticks')}:",
    f"fails {HANDSHAKE_FAILURES_MAX} handshakes within {HANDSHAKE_FAILURE_WINDOW_S:g} s",
    f"and {ADMIN_CONNECTIONS_RESERVED} places beyond `client_connections_max`",
    f"at most {WATCHES_PER_PRINCIPAL_MAX} waiting",
    f"{NODE_RESERVED_BYTES >> 20} MiB past `proposal_bytes_max` and the last "
    f"{NODE_RESERVED_COMMANDS} places",
    f"counters polled every {Intervals().poll_ms // 1000} s",
    f"application XIDs ({', '.join(map(str, sorted(HealthPolicy().application_xids)))})",
    f"`[jobs] log_bytes_max` ({JobLimits().log_bytes_max >> 20} MiB)",
    f"the newest {JobLimits().logs_kept_max:,} logs (or `[jobs] jobs_max`, if more)",
]


@pytest.mark.parametrize("claim", DOCUMENTED_LIMITS)
def test_a_limit_the_readme_quotes_is_the_codes(claim: str) -> None:
    """Each claim is built from the constant in code: a changed constant (or a reworded
    sentence) fails here, so that the README is read again."""
    assert claim in README_PROSE


def test_a_gpu_recovers_after_the_clean_checks_the_readme_says() -> None:
    policy = HealthPolicy()
    assert "three clean checks in a row" in README_PROSE
    assert policy.clean_checks_needed(HealthStatus.FAIL) == 3
    assert policy.clean_checks_needed(HealthStatus.WARN) == 3
    assert policy.clean_checks_needed(HealthStatus.UNKNOWN) == 1  # "as soon as ... again"


def test_logs_kept_cover_jobs_max_as_the_readme_says(tmp_path: pathlib.Path) -> None:
    (raw,) = [block for block in README_TOML if "state_dir" in block]
    raw = with_tls_files({**raw, "jobs": {"jobs_max": 2000}}, tmp_path)
    assert parse_agent_config(raw, base=tmp_path).jobs.logs_kept_max == 2000
