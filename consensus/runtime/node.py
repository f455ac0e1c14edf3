"""A replica process, assembled: durable log, peer mesh, driver, client listener, metrics.

The pieces meet here and nowhere else: frames from peers go to the driver's bounded channel,
the driver's messages go to the mesh's bounded per-peer queues, client connections go to the
request server (which stamps by the driver's one stamp clock, `stamp_clock.py`), and the
metrics endpoint renders the driver's and the transport's counters.
Under TLS the peer mesh and the client listener share one `TlsContexts`, and a `CertWatch`
takes a renewed certificate and key into it, for every new connection, without a restart; it
says ahead, in the log, on the metrics page (`cellar_tls_cert_seconds_left`, of the
certificate presented now) and in the status (`cellar status`), that the certificate the
replica presents is ending (`cert_watch.py`).
The state machine is whatever the caller passes (the GPU-allocation machine for `cellar
replica`), so consensus stays ignorant of it.
"""

from __future__ import annotations

import functools
import logging
import os
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import anyio

from consensus.config import ReplicaConfig
from consensus.prng import Prng
from consensus.records import EpochRecord, Record, RejoinRecord
from consensus.replica import Replica
from consensus.runtime.cert_watch import CertWatch
from consensus.runtime.clock_agreement import SKEW_MS_MAX, ClockAgreement
from consensus.runtime.driver import Driver, DriverConfig
from consensus.runtime.framing import FramedConnection
from consensus.runtime.listener import ClientListener
from consensus.runtime.metrics import Metrics
from consensus.runtime.metrics_http import serve_metrics
from consensus.runtime.node_config import NodeConfig
from consensus.runtime.peer_lives import UNKNOWN_LIFE, Life, PeerLives, new_start_id
from consensus.runtime.peers import LinkTiming, PeerMesh
from consensus.runtime.server import ClientServer
from consensus.runtime.storage import DurableLog
from consensus.runtime.tls import Identity, TlsConfig, TlsContexts
from consensus.state_machine import QueryGate, StateMachine

logger = logging.getLogger("cellar.replica")
CERT_SECONDS_LEFT = "tls.cert_seconds_left"  # a gauge: cellar_tls_cert_seconds_left
# gauges: cellar_stamp_clock_offset_ms, cellar_stamp_clock_steps (consensus/runtime/
# stamp_clock.py)
STAMP_OFFSET_MS = "stamp_clock.offset_ms"
STAMP_STEPS = "stamp_clock.steps"
# gauge cellar_stamp_clock_agrees and counter cellar_driver_system_commands_withheld
# (consensus/runtime/clock_agreement.py)
STAMP_AGREES = "stamp_clock.agrees"
TICKS_WITHHELD = "driver.system_commands_withheld"


def tls_of(config: NodeConfig) -> TlsConfig | None:
    if config.tls is None:
        return None
    return TlsConfig(ca_file=config.tls.ca, cert_file=config.tls.cert, key_file=config.tls.key)


def replica_config(config: NodeConfig) -> ReplicaConfig:
    return ReplicaConfig(
        replica_id=config.replica_id, replica_count=len(config.peers),
        batch_commands_max=config.limits["batch_commands_max"],
        inflight_instances_max=config.limits["inflight_instances_max"],
        defects=frozenset(config.defects),
    ).validate()


def driver_config(config: NodeConfig) -> DriverConfig:
    limits = config.limits
    return DriverConfig(tick_ms=config.tick_ms, idle_wake_ticks=config.idle_wake_ticks,
                        inputs_max=limits["inputs_max"],
                        snapshot_every_slots=limits["snapshot_every_slots"],
                        snapshot_every_bytes=limits["snapshot_every_bytes"],
                        proposal_bytes_max=limits["proposal_bytes_max"],
                        watch_bytes_max=limits["watch_bytes_max"])


def start_replica(core_config: ReplicaConfig, log: DurableLog, *, rejoin: bool) -> Replica:
    """The core, rebuilt from the log; with `rejoin`, on a log just created (or still empty)
    for a replica whose data directory was lost, one that asks every other replica before it
    takes part (`consensus.rejoin`). A log that is still asking, after a restart, goes on
    asking (with `rejoin` or not); `rejoin` on any other log raises RejoinRefused, before
    anything is written."""
    seed = int.from_bytes(os.urandom(8), "big")  # randomized timeouts only
    records = log.records()  # handed over once: the checks below read the same list
    if rejoin and not records:
        # Just created, or left empty by a start cut short before its first record (an
        # empty log never said hello: its start's epoch is on disk first). On disk before
        # anything else: a crash before the core's first Ready must not leave a log that
        # restarts as a replica that never lived.
        log.append([RejoinRecord(False, 0, ())])
        log.sync(always=True)  # with sync = false too
        return Replica.rejoining(core_config, Prng(seed))
    if rejoin and not still_rejoining(records):
        raise RejoinRefused("the data directory holds this replica's log")
    return Replica.restore(core_config, Prng(seed), records)


class RejoinRefused(Exception):
    """`--rejoin` on a directory that holds a replica's log, not one still asking."""


def still_rejoining(records: Sequence[Record]) -> bool:
    """Whether the log is one a --rejoin start created and that never heard every report
    (a restart in the middle: --rejoin again changes nothing)."""
    rejoins = [record for record in records if isinstance(record, RejoinRecord)]
    return bool(rejoins) and not rejoins[-1].reported


class ReplicaNode:
    def __init__(self, config: NodeConfig, log: DurableLog, machine: StateMachine, *,
                 system_command: Callable[[int], bytes] | None = None,
                 rejoin: bool = False) -> None:
        self.config = config
        tls, limits = tls_of(config), config.limits
        # Built before anything is written: OSError or ValueError for a certificate gone since
        # the check. The watch looks hourly under TLS (none on plain TCP); a test may replace
        # it before `run`, or call its `look`.
        self.tls_contexts = TlsContexts(tls) if tls else None
        self.cert_watch = (CertWatch(self.tls_contexts, f"replica {config.replica_id}")
                           if self.tls_contexts else None)
        self.metrics = Metrics()
        self.metrics.describe(STAMP_OFFSET_MS, "The wall clock less this replica's stamps, in "
                                               "ms: past 1000 either way, a step being slewed "
                                               "in at 10 ms a second.")
        self.metrics.describe(STAMP_STEPS, "Steps of the wall clock seen since start.")
        self.metrics.describe(STAMP_AGREES, "1 while a majority of the group, this replica "
                                            f"counted, has stamps within {SKEW_MS_MAX} ms of "
                                            "its own, as their hellos said; 0 and sequencer: "
                                            "no Ticks.")
        self.metrics.describe(TICKS_WITHHELD, "Ticks this replica withheld as sequencer, its "
                                              "stamps not agreeing with its group's.")
        self.metrics.describe(CERT_SECONDS_LEFT, "Seconds until the certificate this replica "
                                                 "presents to new connections ends (negative "
                                                 "once it has).")
        self.transport: Counter[str] = Counter()
        self.metrics_endpoint: Counter[str] = Counter()  # its refusals and accept() retries
        core_config = replica_config(config)
        replica = start_replica(core_config, log, rejoin=rejoin)
        # Who this replica is to its peers, and who they were (`peer_lives.py`): a log opened
        # without an identity (tests of the runtime) takes part in no such check.
        disk = log.identity.disk if log.identity is not None else ""
        life = Life(disk, replica.epoch, new_start_id()) if disk else UNKNOWN_LIFE
        if disk:
            # This start's epoch durable before any hello names it: a later start is at a
            # higher one, so a process at the epoch a peer heard with another start id is
            # one whose directory forgot that start (a restored copy: `peer_lives.py`).
            log.append([EpochRecord(replica.epoch)])
            log.sync(always=True)  # with sync = false too
        lives = PeerLives.load(log.path.parent) if disk else None
        # The Ticks wait for this replica's stamps to agree with its group's, as its peers'
        # hellos say (consensus/runtime/clock_agreement.py)
        self.clock_agreement = ClockAgreement(len(config.peers))
        self.mesh = PeerMesh(
            config.replica_id, (config.me.peer.host, config.me.peer.port),
            {peer.replica_id: (peer.peer.host, peer.peer.port) for peer in config.peers
             if peer.replica_id != config.replica_id},
            tls, on_frame=self._on_frame, queue_frames_max=limits["peer_queue_frames_max"],
            frame_bytes_max=limits["frame_bytes_max"], metrics=self.transport,
            insecure=config.insecure, timing=LinkTiming.of(config.tick_ms, core_config),
            life=life, lives=lives, rejoining=lambda: replica.rejoining_now,
            on_old_life=lambda old: replica.raise_epoch_floor(old.epoch),
            on_peer_rejoined=lambda peer, old: replica.heard_old_life(peer, old.epoch),
            contexts=self.tls_contexts, on_stamp=self.clock_agreement.heard)
        self.driver = Driver(
            replica, log, machine, self.mesh.send, self.metrics,
            config=driver_config(config),
            system_command=system_command, clock_agreement=self.clock_agreement)
        self.mesh.turns = self.driver  # a frame may be taken on its reader's task
        self.mesh.stamp_ms = self.driver.stamp_ms  # the hellos say the driver's stamps
        gate = machine.admit_query if isinstance(machine, QueryGate) else None
        self.server = ClientServer(self.driver, status=self.status, admit_query=gate)
        self.listener = ClientListener(
            (config.me.client.host, config.me.client.port), tls, handle=self._serve_client,
            connections_max=limits["client_connections_max"],
            frame_bytes_max=limits["frame_bytes_max"], metrics=self.transport,
            insecure=config.insecure, contexts=self.tls_contexts)

    def _on_frame(self, sender: int, frame: bytes) -> None:
        self.driver.deliver(sender, frame)

    async def _serve_client(self, identity: Identity, connection: FramedConnection) -> None:
        await self.server.serve(identity.principal(), connection)

    def status(self) -> dict[str, Any]:
        status = self.driver.status()
        # The cluster's size, so that `cellar status` judges a majority of the cluster and not
        # of the endpoints it was given (which may name only some of the replicas).
        status["replica_count"] = len(self.config.peers)
        status["peers_connected"] = sorted(self.mesh.connected())
        # e.g. a peer whose lease timing differs: refused until it is configured as this one
        status["peers_refused"] = {str(peer): reason for peer, reason in self.mesh.refused.items()}
        # each peer's stamp less this replica's, at its hello; Ticks wait while they disagree
        status["clock_offsets_ms"] = {str(peer): offset for peer, offset
                                      in self.clock_agreement.offsets_ms.items()}
        status["clock_agrees"] = self.clock_agreement.agrees()
        rejoin = self.driver.replica.rejoin_state()
        if rejoin is not None:
            status["rejoin"] = rejoin
        status["transport"] = dict(self.transport)
        if self.cert_watch is not None:
            status.update(self.cert_watch.status())
        return status

    def render_metrics(self) -> str:
        status = self.driver.replica.status()
        self.metrics.set("view", status.view)
        self.metrics.set("is_sequencer", int(status.is_sequencer))
        self.metrics.set("executed_slots", status.executed_slots)
        self.metrics.set("commit_prefix", status.commit_prefix)
        self.metrics.set("pending_proposals", status.pending_proposals)
        self.metrics.set("proposal_bytes", self.driver.proposal_bytes)
        self.metrics.set("watch_bytes", self.driver.watch_bytes)
        self.metrics.set("peers_connected", len(self.mesh.connected()))
        for name, value in status.counters:
            self.metrics.set(f"core.{name}", value)
        for name, value in self.transport.items():
            self.metrics.set(name, value)
        for name, value in self.metrics_endpoint.items():
            self.metrics.set(name.replace("transport.", "metrics_endpoint.", 1), value)
        self.driver.stamp_ms()  # a reading: the offset as of now
        self.metrics.set(STAMP_OFFSET_MS, self.driver.stamp_clock.offset_ms)
        self.metrics.set(STAMP_STEPS, self.driver.stamp_clock.steps_detected)
        self.metrics.set(STAMP_AGREES, int(self.clock_agreement.agrees()))
        if self.cert_watch is not None:
            self.metrics.set(CERT_SECONDS_LEFT, int(self.cert_watch.seconds_left()))
        return self.metrics.render()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """Serve until cancelled, or until the driver stops (a storage failure)."""
        async with anyio.create_task_group() as tasks:
            await tasks.start(self.mesh.run)
            await tasks.start(self.listener.run)
            if self.cert_watch is not None:
                tasks.start_soon(self.cert_watch.run)
            if self.config.metrics is not None:
                await tasks.start(functools.partial(
                    serve_metrics, self.config.metrics.host, self.config.metrics.port,
                    self.render_metrics, metrics=self.metrics_endpoint))
            logger.info("replica %d serving clients on %s, peers on %s",
                        self.config.replica_id, self.config.me.client, self.config.me.peer)
            if self.driver.replica.rejoining_now:
                logger.warning("replica %d %s; `cellar status` says how far it is",
                               self.config.replica_id, self.driver.replica.rejoin_state())
            if self.config.defects:
                logger.warning("replica %d runs with DELIBERATE PROTOCOL DEFECTS %s: it is "
                               "not safe, and is only for showing that the harness finds them",
                               self.config.replica_id,
                               ", ".join(defect.value for defect in self.config.defects))
            task_status.started()
            await self.driver.run()
