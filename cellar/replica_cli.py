"""`cellar replica --config FILE`: run one replica of the GPU-allocation store (or, with
`machine = "kv"`, of the plain key-value store the peer benchmark uses).

Exit status: 0 after a clean stop (SIGTERM or SIGINT), 78 for a bad configuration file (TLS
files that cannot serve included: refused before the data directory is touched), 69 when a
client, peer or metrics port cannot be listened on (in use, or not this host's address), and
the data directory's own codes for storage trouble (see consensus.runtime.storage_errors: a
missing, locked or corrupt data directory, or a failed write or sync), and 76 when the log
raises the state machine's rules past what this build knows (statemachine/rules.py).
"""

from __future__ import annotations

import argparse
import logging
import pathlib
import sys

from cellar.daemon_process import (
    EXIT_CONFIG,
    EXIT_UNAVAILABLE,
    add_logging_arguments,
    loop_options,
    serve_until_signalled,
    start_logging,
)
from cellar.exception_groups import run_unwrapped
from cellar.gc_tuning import quiet_garbage_collector
from cellar.kv.machine import KvMachine
from cellar.malloc_tuning import keep_freed_memory
from consensus.runtime.accept import CannotListen
from consensus.runtime.data_identity import DataIdentity
from consensus.runtime.node import RejoinRefused, ReplicaNode
from consensus.runtime.node_config import NodeConfigError, check_tls_files, load_node_config
from consensus.runtime.storage import DurableLog
from consensus.runtime.storage_errors import EXIT_LOG_VERSION_UNSUPPORTED, StorageError
from statemachine.codec import encode_command
from statemachine.machine import Machine
from statemachine.rules import RulesTooNew, system_tick

logger = logging.getLogger("cellar.replica")
SWITCH_INTERVAL_S = 0.0002


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=pathlib.Path, required=True,
                        help="the replica's TOML configuration")
    first_start = parser.add_mutually_exclusive_group()
    first_start.add_argument("--init", action="store_true",
                             help="a new replica's first start: create the data directory "
                                  "and an empty log (only where the directory does not exist "
                                  "yet or is empty; a directory that already holds a log "
                                  "is opened as it is, without --init)")
    first_start.add_argument("--rejoin", action="store_true",
                             help="the first start of a replica whose data directory was "
                                  "lost: create a new one, as --init does, and ask every "
                                  "other replica (all must be up) what the lost one promised "
                                  "before taking part")
    add_logging_arguments(parser)
    parser.set_defaults(handler=run)


def tick_command(now_ms: int) -> bytes:
    del now_ms  # the envelope carries the time; the Tick names this build's rules
    return encode_command(system_tick())


def run(args: argparse.Namespace) -> int:
    start_logging(args)
    try:
        config = load_node_config(args.config)
        check_tls_files(config)
    except NodeConfigError as error:
        print(f"cellar replica: {error}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        log = DurableLog.open(config.data_dir, create=args.init or args.rejoin,
                              synced=config.sync,
                              identity=DataIdentity(config.replica_id, len(config.peers),
                                                    config.machine))
    except StorageError as error:
        print(f"cellar replica: {error}", file=sys.stderr)
        return error.exit_code
    try:
        if not config.sync:
            logger.warning("sync = false: acknowledged commands can be lost on power failure")
        if config.machine == "kv":
            node = ReplicaNode(config, log, KvMachine(), rejoin=args.rejoin)
        else:
            node = ReplicaNode(config, log, Machine(), system_command=tick_command,
                               rejoin=args.rejoin)
        # The driver syncs in a worker thread: let it have the interpreter lock back within
        # 0.2 ms of its sync returning, not the default 5 ms.
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        keep_freed_memory()
        backend, options = loop_options(config.loop)
        with quiet_garbage_collector():
            run_unwrapped(serve_until_signalled, node.run, backend=backend,
                          backend_options=options)
    except StorageError as error:
        logger.error("stopping: %s", error)
        print(f"cellar replica: {error}", file=sys.stderr)
        return error.exit_code
    except RejoinRefused:
        print(f"cellar replica: {config.data_dir} holds this replica's log: --rejoin is only "
              "for the first start on a new, empty data directory after the old one was "
              "lost (start without it)", file=sys.stderr)
        return EXIT_CONFIG
    except CannotListen as error:
        print(f"cellar replica: {error}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except RulesTooNew as error:
        logger.error("stopping: %s", error)
        print(f"cellar replica: {error}", file=sys.stderr)
        return EXIT_LOG_VERSION_UNSUPPORTED
    finally:
        log.close()
    return 0
