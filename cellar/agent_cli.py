"""`cellar agent --config FILE`: the node agent daemon for one GPU node.

It reads the node's GPUs through NVML (or a fake backend, `backend = "fake:PROFILE"`, for
trials without a GPU), registers them with the store under the node's certificate, reports
their health, and runs the jobs the store binds to them. Exit status: 0 after a clean stop
(SIGTERM or SIGINT; the jobs keep running and the next start adopts them), 78 for a bad
configuration file, a certificate that does not name this node or a state_dir that cannot be
created or written, 69 when the metrics address cannot be listened on, 75 when another agent
runs on the state_dir.
"""

from __future__ import annotations

import argparse
import logging
import pathlib
import sys
import tempfile
import zlib

from agent.config import AgentConfig, AgentConfigError, load_agent_config
from agent.daemon import Agent
from agent.gpu import GpuBackend
from cellar.daemon_process import (
    EXIT_CONFIG,
    EXIT_UNAVAILABLE,
    add_logging_arguments,
    loop_options,
    serve_until_signalled,
    start_logging,
)
from cellar.exception_groups import run_unwrapped
from consensus.runtime.accept import CannotListen
from consensus.runtime.certs import identity_in_file
from consensus.runtime.client import CellarClient, ClientConfig
from consensus.runtime.connect import connector
from consensus.runtime.storage_errors import DataDirectoryLocked
from consensus.runtime.tls import IdentityRefused, IdentityRole, TlsConfig, TlsContexts
from statemachine.store import GpuStore

logger = logging.getLogger("cellar.agent")
CLIENT = ClientConfig(attempt_timeout_s=2.0, deadline_s=10.0, sessions=16)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=pathlib.Path, required=True,
                        help="the agent's TOML configuration")
    add_logging_arguments(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    start_logging(args)
    try:
        config = load_agent_config(args.config)
        tls = tls_for(config)
        gpus = gpu_backend(config)
    except (AgentConfigError, IdentityRefused, ValueError) as error:
        print(f"cellar agent: {error}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        config.state_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=config.state_dir):  # writable, not only present
            pass
    except OSError as error:
        print(f"cellar agent: state_dir: cannot create or write {config.state_dir} "
              f"({error.strerror})", file=sys.stderr)
        return EXIT_CONFIG
    try:
        # one set of contexts: the agent's CertWatch renews what the store client dials with
        contexts = TlsContexts(tls) if tls is not None else None
    except (OSError, ValueError) as error:  # changed since the check
        print(f"cellar agent: tls: {error}", file=sys.stderr)
        return EXIT_CONFIG
    client = CellarClient(config.endpoints, connector(tls, insecure=config.insecure,
                                                      contexts=contexts), CLIENT)
    backend, options = loop_options(config.loop)
    try:
        run_unwrapped(_serve, config, gpus, client, contexts, backend=backend,
                      backend_options=options)
    except CannotListen as error:  # the metrics address, as `cellar replica` says it
        print(f"cellar agent: {error}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except DataDirectoryLocked as error:
        who = f"process {error.holder}" if error.holder is not None else "another process"
        print(f"cellar agent: state_dir: {config.state_dir} is in use by {who}, another agent: "
              "two would start the same jobs twice. Stop it, or give this one its own "
              "state_dir", file=sys.stderr)
        return error.exit_code
    return 0


def tls_for(config: AgentConfig) -> TlsConfig | None:
    """The node's TLS files, after checking the certificate names this node."""
    if config.tls is None:
        return None
    identity = identity_in_file(config.tls.cert)
    if identity.role is not IdentityRole.NODE or identity.name != config.node:
        raise AgentConfigError(f"tls.cert: {config.tls.cert} names {identity}, but this agent "
                               f"acts for cellar://node/{config.node}")
    tls = TlsConfig(ca_file=config.tls.ca, cert_file=config.tls.cert, key_file=config.tls.key)
    tls.check()  # TlsFileRefused (a ValueError) naming the file that cannot serve
    return tls


def gpu_backend(config: AgentConfig) -> GpuBackend:
    if config.backend.startswith("fake:"):
        from agent.fake_backend import FakeGpuBackend  # noqa: PLC0415 - trials only

        logger.warning("using the fake GPU backend %r: no real GPU is read", config.backend)
        seed = zlib.crc32(config.node.encode())  # each fake node its own GPU UUIDs
        return FakeGpuBackend.from_profile(config.backend.removeprefix("fake:"), seed=seed)
    from agent.nvml_backend import NvmlBackend  # noqa: PLC0415 - loads NVML only when used

    return NvmlBackend()


async def _serve(config: AgentConfig, backend: GpuBackend, client: CellarClient,
                 contexts: TlsContexts | None) -> None:
    async with client:
        agent = Agent(config, backend, GpuStore(client), tls_contexts=contexts)
        await serve_until_signalled(agent.run)
