"""The peer mesh: framed, mutually authenticated messaging between the replicas of one group.

Each replica listens on its peer address and dials every other replica. A connection carries
frames one way only: a replica sends on the connection it dialed and receives on the ones it
accepted, so the two directions between a pair fail and recover independently.

- Sending never blocks: `send` puts the frame on the peer's bounded queue (frames and bytes both
  capped) and returns False, counting the drop, when it is full. One task per peer empties the
  queue, many frames to a write (merged flushing), while connected; frames wait while it is not.
  Consensus tolerates lost messages (it retransmits on its ticks), so a drop is never fatal.
- Dialing retries for ever with capped, jittered exponential backoff, reset once a connection
  has stayed up for a while. A frame whose write fails with the connection is counted as
  dropped: it may or may not have arrived, and the core does not care which.
- Who sent a frame comes from the certificate: the dialer proves `cellar://replica/<id>`, and
  the acceptor refuses anything but another replica of its group. The dialer checks in turn that
  it reached the replica it meant to. Refusals are counted and logged; nothing else changes.
- Received frames go to `on_frame(sender, payload)` unread: decoding and validation are the
  core's. A length above the cap, or a stream that ends inside a frame, closes that one
  connection (there is no way to find the next frame) and is counted; other peers carry on.
- Every dialer's first frame is its hello: its replica id and the timing the read lease rests
  on (`LinkTiming`: how long a tick is, how many ticks a lease lasts, the margin the sequencer
  takes off it). A lease is counted in ticks, by the sequencer and its followers each on its
  own clock, so a replica counting longer ticks than its followers would trust its lease past
  their promises and could serve a stale read: the acceptor refuses a peer whose timing differs
  from its own (or that sent no hello), logs an error naming both values, and counts it
  (`TIMING_REFUSED`). Each side dials the other, so both refuse, and both say why. A hello
  naming another build's peer protocol is refused the same way (`PROTOCOL_REFUSED`).
- The hello also carries the dialer's life (its data directory's id and its start on it) and
  the life it last heard of the replica it dials: a peer that comes back having forgotten (on
  an empty directory, or an older copy) is refused by those that heard it (`LIFE_REFUSED`),
  and stops when one tells it so (`peer_lives.py`). One started with `--rejoin` on a new
  directory says so in its hello: its peers take its new directory (`PEER_REJOINED`) and tell
  their cores how far its lost life went, as the floor of its command tags' epoch
  (`consensus.rejoin`); a peer whose hello still names the lost life tells it too.
- And the dialer's stamp as it sends it (`stamp_ms`): the acceptor hands it, with its own
  stamp as it hears it, to `on_stamp`, which judges whether this replica's clock agrees with
  its group's before its Ticks move the state machine's time (`clock_agreement.py`).
- Newest wins: a new authenticated connection from a peer closes its older one, so a peer that
  restarted is never shadowed by a half-open connection from its previous life.
- Inbound connections are bounded twice: at most `handshakes_max` not yet authenticated (one
  more is closed at once and counted), and at most `inbound_connections_max` authenticated ones
  (a live connection per peer and its replacement). A peer's place is taken only once it
  proved who it is, so connections that never authenticate cannot crowd out a peer; they can
  only fill the handshake places, each for at most `handshake_timeout_s`, and a host that
  keeps failing its handshakes is barred for a while (`handshake_guard.py`). A failed accept()
  (out of descriptors, a reset in the backlog) is retried, never fatal (`accept.py`).

With `insecure=True` (local development only) there is no TLS; the replica id in the hello is
taken unchecked. With TLS it must be the certificate's.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import random
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import anyio
import anyio.abc

from consensus.codec import MESSAGE_BYTES_MAX
from consensus.config import ReplicaConfig
from consensus.runtime.accept import Slots, accept_forever, authenticated, holding, listen_tcp
from consensus.runtime.backoff import Backoff
from consensus.runtime.deadlines import Doorbell
from consensus.runtime.framing import (
    CONNECTIONS_ACCEPTED,
    CONNECTIONS_LOST,
    CONNECTIONS_REFUSED_LIMIT,
    DIALS_FAILED,
    FRAMES_DROPPED_DISCONNECTED,
    FRAMES_DROPPED_OVERSIZED,
    FRAMES_DROPPED_QUEUE_FULL,
    FRAMES_RECEIVED,
    FRAMES_REFUSED_OVERSIZED,
    FRAMES_TRUNCATED,
    IDENTITY_REFUSED,
    LIFE_REFUSED,
    PEER_REJOINED,
    PROTOCOL_REFUSED,
    RECONNECTS,
    TIMING_REFUSED,
    WRITE_BYTES_MAX,
    FrameReader,
    FrameTooLarge,
    FrameWriter,
    Metrics,
    TransportError,
    TruncatedFrame,
    check_frame_bytes_max,
)
from consensus.runtime.handshake_guard import HandshakeGuard
from consensus.runtime.inbox import TurnHost
from consensus.runtime.peer_lives import UNKNOWN_LIFE, Life, PeerLives
from consensus.runtime.socket_tuning import tune_socket
from consensus.runtime.storage_errors import DataDirectoryForgotten, StorageError, StorageFailed
from consensus.runtime.tls import (
    CONNECTION_ERRORS,
    HANDSHAKE_TIMEOUT_S,
    Identity,
    IdentityRole,
    TlsConfig,
    TlsContexts,
    check_security,
    contexts_of,
    remote_address,
    remote_host,
    tls_handshake,
)
from consensus.runtime.write_through import WriteThrough, write_through

logger = logging.getLogger("cellar.transport")

Address = tuple[str, int]
PEER_HELLO = b"cellar-peer "  # followed by the dialer's `Hello`, as a JSON object
# What replicas say to each other, and what they replicate, changes between builds (messages,
# records, commands): builds of different protocols refuse each other's hellos, so a cluster
# is never run by two (upgrade every replica together). A hello without the field is an
# older build's. 3: the rejoin messages, and Ticks that name the machine's rules. 4: hellos
# carry the dialer's stamp (clock_agreement.py).
PEER_PROTOCOL = 4
HELLO_BYTES_MAX = 1024
CONNECT_TIMEOUT_S = 5.0
BACKOFF_INITIAL_S = 0.05
BACKOFF_MAX_S = 2.0
HANDSHAKES_MAX_DEFAULT = 64


def _check_group(replica_id: int, peers: Mapping[int, Address]) -> None:
    """ValueError for a replica listing itself, or a peer id no certificate can carry."""
    if replica_id in peers:
        raise ValueError(f"peers: replica {replica_id} lists itself")
    for peer in peers:
        Identity.replica(peer)


@dataclass(frozen=True, slots=True)
class LinkTiming:
    """What every replica of a group must agree on for the read lease to be safe (module
    docstring; the defaults are the node file's and `ReplicaConfig`'s)."""

    tick_ms: int = 10
    lease_ticks: int = 40
    lease_drift_ticks: int = 4

    @classmethod
    def of(cls, tick_ms: int, config: ReplicaConfig) -> LinkTiming:
        return cls(tick_ms, config.lease_ticks, config.lease_drift_ticks)

    def differences(self, theirs: LinkTiming) -> str:
        """E.g. "tick_ms 15 there, 10 here" for each field that differs."""
        return "; ".join(f"{name} {getattr(theirs, name)} there, {getattr(self, name)} here"
                         for name in _TIMING_FIELDS
                         if getattr(theirs, name) != getattr(self, name))


_TIMING_FIELDS = tuple(field.name for field in dataclasses.fields(LinkTiming))


@dataclass(frozen=True, slots=True)
class Hello:
    """A dialer's first frame on a peer connection: who it is, its lease timing, its life and
    the life it last heard of the replica it dials (`peer_lives.py`)."""

    replica_id: int
    timing: LinkTiming
    life: Life = UNKNOWN_LIFE
    yours: Life = UNKNOWN_LIFE
    # The dialer lost its data directory and rejoins on a new one (`consensus.rejoin`); only
    # a rejoining dialer sends the field.
    rejoining: bool = False
    protocol: int = PEER_PROTOCOL
    # The dialer's stamp as it sent the hello (clock_agreement.py); None from an older build
    stamp_ms: int | None = None

    def encode(self) -> bytes:
        fields = {"replica_id": self.replica_id,
                  **{name: getattr(self.timing, name) for name in _TIMING_FIELDS},
                  "disk": self.life.disk, "epoch": self.life.epoch, "start": self.life.start,
                  "your_disk": self.yours.disk, "your_epoch": self.yours.epoch,
                  "your_start": self.yours.start, "protocol": self.protocol,
                  **({"rejoining": True} if self.rejoining else {}),
                  **({"stamp_ms": self.stamp_ms} if self.stamp_ms is not None else {})}
        return PEER_HELLO + json.dumps(fields, sort_keys=True).encode()

    @classmethod
    def parse(cls, frame: bytes) -> Hello | None:
        """The hello in `frame`, or None if it is none (another version's, or garbage)."""
        body = frame.removeprefix(PEER_HELLO)
        if body == frame or len(frame) > HELLO_BYTES_MAX:
            return None
        try:
            fields = json.loads(body)
        except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the stack
            return None
        if not isinstance(fields, dict) or \
                set(fields) - _HELLO_OPTIONAL_FIELDS != _HELLO_FIELDS or \
                any(type(fields[name]) is not int for name in _HELLO_INT_FIELDS) or \
                any(type(fields[name]) is not str for name in _HELLO_STR_FIELDS) or \
                fields.get("rejoining", True) is not True or \
                type(fields.get("stamp_ms", 0)) is not int:
            return None
        rejoining = fields.pop("rejoining", False)
        stamp_ms = fields.pop("stamp_ms", None)
        life = Life(fields.pop("disk"), fields.pop("epoch"), fields.pop("start"))
        yours = Life(fields.pop("your_disk"), fields.pop("your_epoch"), fields.pop("your_start"))
        if not (life.is_valid() and yours.is_valid()):
            return None
        replica_id, protocol = fields.pop("replica_id"), fields.pop("protocol")
        return cls(replica_id, LinkTiming(**fields), life, yours, rejoining, protocol, stamp_ms)


_HELLO_INT_FIELDS = ("replica_id", *_TIMING_FIELDS, "epoch", "your_epoch", "protocol")
_HELLO_STR_FIELDS = ("disk", "start", "your_disk", "your_start")
_HELLO_FIELDS = {*_HELLO_INT_FIELDS, *_HELLO_STR_FIELDS}
_HELLO_OPTIONAL_FIELDS = {"rejoining", "stamp_ms"}


class Outbox:
    """A peer's queue of frames to send: bounded in frames and in bytes, never blocking."""

    def __init__(self, *, frames_max: int, bytes_max: int) -> None:
        assert frames_max > 0
        assert bytes_max > 0
        self.frames_max = frames_max
        self.bytes_max = bytes_max
        self.queued_bytes = 0
        self._frames: deque[bytes] = deque()
        self._doorbell = Doorbell()
        self._through: WriteThrough | None = None  # while a connection's writer waits

    def __len__(self) -> int:
        return len(self._frames)

    def push(self, frame: bytes) -> bool:
        """Queue `frame`, or write it at once while the writer waits with nothing queued
        (consensus/runtime/write_through.py); False if the queue is full."""
        through = self._through
        if through is not None and not self._frames and through.write(frame):
            return True
        if len(self._frames) >= self.frames_max:
            return False
        if self.queued_bytes + len(frame) > self.bytes_max:
            return False
        self._frames.append(frame)
        self.queued_bytes += len(frame)
        self._doorbell.ring()
        return True

    async def wait(self, through: WriteThrough | None = None) -> None:
        """Return once at least one frame is queued; meanwhile `push` may write through
        `through`, the waiting writer's gate."""
        if through is not None:
            through.waiting = True
        self._through = through
        try:
            while not self._frames:
                await self._doorbell.sleep()
        finally:
            self._through = None
            if through is not None:
                through.waiting = False

    def take(self, frames_max: int, bytes_max: int) -> list[bytes]:
        """Up to `frames_max` frames from the front, at least one, else within `bytes_max`."""
        frames = self._frames
        assert frames
        batch = [frames.popleft()]
        total = len(batch[0])
        for _ in range(min(frames_max - 1, len(frames))):
            size = len(frames[0])
            if total + size > bytes_max:
                break
            total += size
            batch.append(frames.popleft())
        self.queued_bytes -= total
        assert self.queued_bytes >= 0
        return batch


@dataclass
class _Link:
    outbox: Outbox
    backoff: Backoff
    connected: bool = False
    connections: int = 0
    inbound: anyio.CancelScope | None = None  # the receiving connection from this peer


class PeerMesh:
    """Connections to and from every other replica; see the module docstring."""

    def __init__(
        self, replica_id: int, listen: Address, peers: Mapping[int, Address],
        tls: TlsConfig | None, *, on_frame: Callable[[int, bytes], None],
        queue_frames_max: int = 4096, queue_bytes_max: int = 64 << 20,
        frame_bytes_max: int = MESSAGE_BYTES_MAX, batch_frames_max: int = 1024,
        metrics: Metrics | None = None, insecure: bool = False,
        backoff_initial_s: float = BACKOFF_INITIAL_S, backoff_max_s: float = BACKOFF_MAX_S,
        handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
        connect_timeout_s: float = CONNECT_TIMEOUT_S, rng: random.Random | None = None,
        handshakes_max: int = HANDSHAKES_MAX_DEFAULT, guard: HandshakeGuard | None = None,
        timing: LinkTiming = LinkTiming(), life: Life = UNKNOWN_LIFE,
        lives: PeerLives | None = None, rejoining: Callable[[], bool] = lambda: False,
        on_old_life: Callable[[Life], None] | None = None,
        on_peer_rejoined: Callable[[int, Life], None] | None = None,
        contexts: TlsContexts | None = None, stamp_ms: Callable[[], int] | None = None,
        on_stamp: Callable[[int, int, int], None] | None = None,
    ) -> None:
        check_security(tls, insecure=insecure, what=f"replica {replica_id} peer mesh")
        check_frame_bytes_max(frame_bytes_max)
        _check_group(replica_id, peers)
        if not 0 < backoff_initial_s <= backoff_max_s:
            raise ValueError(f"backoff: need 0 < initial ({backoff_initial_s}) <= max "
                             f"({backoff_max_s})")
        if min(queue_frames_max, queue_bytes_max, batch_frames_max, handshakes_max) <= 0:
            raise ValueError("queue_frames_max, queue_bytes_max, batch_frames_max, "
                             "handshakes_max: must be positive")
        self.replica_id = replica_id
        self.identity = Identity.replica(replica_id)
        self.listen, self.peers, self.tls = listen, dict(peers), tls
        self.on_frame = on_frame
        self.turns: TurnHost | None = None  # who may let a reader run its turn (inbox.py)
        self.frame_bytes_max = frame_bytes_max
        self.batch_frames_max = batch_frames_max
        self.metrics: Metrics = Metrics() if metrics is None else metrics
        self.handshake_timeout_s = handshake_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.backoff_max_s = backoff_max_s
        # Authenticated: a live connection per peer, and its replacement while newest wins.
        self.inbound_connections_max = max(1, 2 * len(peers))
        self._inbound = Slots(self.inbound_connections_max)
        self._handshakes = Slots(handshakes_max)  # accepted, not yet authenticated
        self._guard = HandshakeGuard() if guard is None else guard
        self.address: Address | None = None  # where it listens, once running
        self.timing = timing
        self.life = life  # this replica's (`peer_lives.py`)
        self.lives = lives  # the peers' as last heard; None: no check (tests of the mesh)
        # Whether this replica lost its data directory and still asks the others (its core
        # says): its hellos say so, and a peer naming its old life tells it how far that
        # life went (`on_old_life`) instead of stopping it.
        self.rejoining = rejoining
        self.on_old_life = on_old_life
        self.on_peer_rejoined = on_peer_rejoined  # a peer taken back on a new disk, its old life
        # This replica's stamp for its hellos, and the hearer of a peer's (peer, its stamp,
        # this replica's as heard); None: no stamps (tests of the mesh)
        self.stamp_ms, self.on_stamp = stamp_ms, on_stamp
        self.stopped_by: StorageError | None = None  # why the mesh stopped the replica
        self._scope: anyio.CancelScope | None = None
        self._hearing_lives: anyio.Lock | None = None
        # Why each peer's last connection was refused for its hello, until one is accepted
        self.refused: dict[int, str] = {}
        rng = rng or random.Random()
        self._links = {peer: _Link(Outbox(frames_max=queue_frames_max, bytes_max=queue_bytes_max),
                                   Backoff(backoff_initial_s, backoff_max_s, rng))
                       for peer in self.peers}
        self._changed: anyio.Event | None = None
        # The process's contexts (renewed by its CertWatch), or the mesh's own, built at `run`;
        # each handshake reads them as it starts.
        self._shared_contexts = contexts
        self._contexts: TlsContexts | None = None

    # --- The API the driver uses -------------------------------------------------------------

    def send(self, peer: int, frame: bytes) -> bool:
        """Queue `frame` for `peer`; False (and counted) if it is over the cap or the queue full.

        Never blocks, and works while the peer is down: the frame waits for the connection.
        """
        link = self._links.get(peer)
        if link is None:
            raise ValueError(f"replica {peer} is not a peer of replica {self.replica_id}")
        if len(frame) > self.frame_bytes_max:
            self.metrics[FRAMES_DROPPED_OVERSIZED] += 1
            return False
        if not link.outbox.push(frame):
            self.metrics[FRAMES_DROPPED_QUEUE_FULL] += 1
            return False
        return True

    def connected(self) -> set[int]:
        """The peers we hold a sending connection to now."""
        return {peer for peer, link in self._links.items() if link.connected}

    def queued(self, peer: int) -> int:
        """Frames waiting to be sent to `peer`."""
        return len(self._links[peer].outbox)

    async def wait_connected(self, peers: Iterable[int] | None = None) -> None:
        """Return once we hold a sending connection to each of `peers` (default: all)."""
        wanted = set(self.peers if peers is None else peers)
        assert wanted <= set(self.peers), wanted
        while not wanted <= self.connected():  # each pass waits for a change
            assert self._changed is not None, "the mesh is not running"
            await self._changed.wait()

    async def run(self, *, task_status: anyio.abc.TaskStatus[Address] = anyio.TASK_STATUS_IGNORED,
                  ) -> None:
        """Listen and dial until cancelled; `task_status.started` gets the address bound."""
        assert self._changed is None, "a mesh runs once"
        self._changed = anyio.Event()
        self._hearing_lives = anyio.Lock()
        self._contexts = contexts_of(self.tls, self._shared_contexts,
                                     what=f"replica {self.replica_id} peer mesh")
        host, port = self.listen
        listener = await listen_tcp(host, port)
        async with listener, anyio.create_task_group() as group:
            self._scope = group.cancel_scope
            bound_port: int = listener.extra(anyio.abc.SocketAttribute.local_port)
            self.address = (host, bound_port)
            group.start_soon(functools.partial(
                accept_forever, listener, self._serve_inbound, group,
                what=f"replica {self.replica_id} peer listener", metrics=self.metrics))
            for peer in sorted(self.peers):
                group.start_soon(self._dial_forever, peer)
            logger.info("replica %d: peer mesh on %s:%d", self.replica_id, host, bound_port)
            task_status.started(self.address)
        if self.stopped_by is not None:
            raise self.stopped_by

    def _stop(self, error: StorageError) -> None:
        """Stop the mesh, and with it the replica, for `error` (raised out of `run`)."""
        if self.stopped_by is None:
            self.stopped_by = error
        assert self._scope is not None
        self._scope.cancel()

    def _set_connected(self, peer: int, connected: bool) -> None:
        self._links[peer].connected = connected
        assert self._changed is not None
        self._changed.set()
        self._changed = anyio.Event()

    # --- Sending: one dialer per peer ----------------------------------------------------------

    async def _dial_forever(self, peer: int) -> None:
        link = self._links[peer]
        while True:  # until cancelled: a peer may stay down for any length of time
            stream = await self._dial(peer)
            if stream is None:
                self.metrics[DIALS_FAILED] += 1
                await anyio.sleep(link.backoff.next_delay_s())
                continue
            if link.connections:
                self.metrics[RECONNECTS] += 1
            link.connections += 1
            began = anyio.current_time()
            self._set_connected(peer, True)
            try:
                await self._send_until_broken(peer, stream)
            finally:
                self._set_connected(peer, False)
                await anyio.aclose_forcefully(stream)
            if anyio.current_time() - began >= self.backoff_max_s:
                link.backoff.reset()
            await anyio.sleep(link.backoff.next_delay_s())

    async def _dial(self, peer: int) -> anyio.abc.ByteStream | None:
        """A connection to `peer` that proved its identity, or None (the reason logged)."""
        host, port = self.peers[peer]
        try:
            with anyio.fail_after(self.connect_timeout_s):
                stream: anyio.abc.ByteStream = await anyio.connect_tcp(host, port)
        except CONNECTION_ERRORS as error:
            logger.debug("replica %d: dialing replica %d at %s:%d: %r", self.replica_id, peer,
                         host, port, error)
            return None
        tune_socket(stream)
        if self._contexts is None:
            return await self._say_hello(stream, peer)
        accepted = await tls_handshake(stream, self._contexts.client, server_side=False,
                                       metrics=self.metrics, timeout_s=self.handshake_timeout_s)
        if accepted is None:
            return None
        tls_stream, identity = accepted
        if identity != Identity.replica(peer):
            self.metrics[IDENTITY_REFUSED] += 1
            logger.warning("replica %d: %s:%d is %s, not replica %d", self.replica_id, host,
                           port, identity, peer)
            await anyio.aclose_forcefully(tls_stream)
            return None
        return await self._say_hello(tls_stream, peer)

    async def _say_hello(self, stream: anyio.abc.ByteStream, peer: int,
                         ) -> anyio.abc.ByteStream | None:
        writer = FrameWriter(stream, frame_bytes_max=self.frame_bytes_max, metrics=Metrics())
        yours = self.lives.of(peer) if self.lives is not None else UNKNOWN_LIFE
        try:
            stamp_ms = self.stamp_ms() if self.stamp_ms is not None else None
            await writer.send(Hello(self.replica_id, self.timing, self.life, yours,
                                    self.rejoining(), stamp_ms=stamp_ms).encode())
        except CONNECTION_ERRORS:
            await anyio.aclose_forcefully(stream)
            return None
        return stream

    async def _send_until_broken(self, peer: int, stream: anyio.abc.ByteStream) -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(self._watch_for_close, peer, stream, group.cancel_scope)
            await self._send_forever(peer, stream)
            group.cancel_scope.cancel()

    async def _send_forever(self, peer: int, stream: anyio.abc.ByteStream) -> None:
        outbox = self._links[peer].outbox
        writer = FrameWriter(stream, frame_bytes_max=self.frame_bytes_max, metrics=self.metrics)
        through = write_through(writer.write_now if writer.writes_now else None)
        while True:  # until the connection breaks or the mesh stops
            await outbox.wait(through)
            batch = outbox.take(self.batch_frames_max, WRITE_BYTES_MAX)
            written = False
            try:
                await writer.send_many(batch)  # one write: the batch fits WRITE_BYTES_MAX
                written = True
            except CONNECTION_ERRORS as error:
                self.metrics[CONNECTIONS_LOST] += 1
                logger.info("replica %d: connection to replica %d lost: %r", self.replica_id,
                            peer, error)
                return
            finally:
                if not written:
                    self.metrics[FRAMES_DROPPED_DISCONNECTED] += len(batch)

    async def _watch_for_close(self, peer: int, stream: anyio.abc.ByteStream,
                               scope: anyio.CancelScope) -> None:
        """Peers never send on a connection we dialed: any read result means it is over."""
        try:
            await stream.receive(1)
            logger.warning("replica %d: replica %d sent on our sending connection",
                           self.replica_id, peer)
        except CONNECTION_ERRORS:
            pass
        self.metrics[CONNECTIONS_LOST] += 1
        scope.cancel()

    # --- Receiving: one task per accepted connection ------------------------------------------

    @property
    def handshakes(self) -> int:
        """Inbound connections accepted and not yet authenticated (or refused) now."""
        return self._handshakes.in_use

    @property
    def inbound_connections(self) -> int:
        """Authenticated inbound connections now."""
        return self._inbound.in_use

    async def _serve_inbound(self, stream: anyio.abc.SocketStream) -> None:
        try:
            accepted = await authenticated(stream, self._accept, self._handshakes, self.metrics,
                                           guard=self._guard, host=remote_host(stream))
            if accepted is None:
                return
            with holding(self._inbound, self.metrics, CONNECTIONS_REFUSED_LIMIT) as held:
                if held:
                    await self._receive_from(*accepted)
        finally:
            await anyio.aclose_forcefully(stream)

    async def _accept(self, stream: anyio.abc.SocketStream,
                      ) -> tuple[int, anyio.abc.ByteStream, FrameReader] | None:
        """The authenticated sender's id and its stream, or None (counted) if refused."""
        tune_socket(stream)
        if self._contexts is None:
            return await self._hear_hello(stream, None)
        accepted = await tls_handshake(stream, self._contexts.server, server_side=True,
                                       metrics=self.metrics, timeout_s=self.handshake_timeout_s)
        if accepted is None:
            return None
        tls_stream, identity = accepted
        if not self._is_peer(identity):
            self.metrics[IDENTITY_REFUSED] += 1
            logger.warning("replica %d: refused %s from %s: not a peer", self.replica_id,
                           identity, remote_address(stream))
            await anyio.aclose_forcefully(tls_stream)
            return None
        heard = await self._hear_hello(tls_stream, identity.replica_id)
        if heard is None:
            await anyio.aclose_forcefully(tls_stream)
        return heard

    def _is_peer(self, identity: Identity) -> bool:
        if identity.role is not IdentityRole.REPLICA:
            return False
        return identity.replica_id in self.peers

    async def _hear_hello(self, stream: anyio.abc.ByteStream, certified: int | None,
                          ) -> tuple[int, anyio.abc.ByteStream, FrameReader] | None:
        """The dialer's id, its stream and reader, once its hello names this replica's timing;
        None (counted, and logged when the reason is new) if not. `certified`: the replica
        its certificate names (None without TLS: the hello's id is taken unchecked). The
        hello is read under its own cap, so a dialer that named no replica yet cannot make
        this one buffer a whole frame's worth."""
        reader = FrameReader(stream, frame_bytes_max=HELLO_BYTES_MAX)
        try:
            with anyio.fail_after(self.handshake_timeout_s):
                hello = Hello.parse(await reader.receive())
        except (TransportError, *CONNECTION_ERRORS):
            hello = None
        heard_ms = self.stamp_ms() if self.stamp_ms is not None else None  # as it arrived
        if certified is not None and (hello is None or hello.replica_id != certified):
            self._refuse(certified, "it sent no hello naming itself and its lease timing "
                         "(a replica of an older version?)")
            return None
        try:
            identity = Identity.replica(hello.replica_id) if hello is not None else None
        except ValueError:  # an id no certificate can carry
            identity = None
        if hello is None or identity is None or not self._is_peer(identity):
            self.metrics[IDENTITY_REFUSED] += 1
            return None
        if hello.protocol != PEER_PROTOCOL:
            self._refuse(hello.replica_id, f"it runs peer protocol {hello.protocol}, this "
                         f"replica {PEER_PROTOCOL}: another build; every replica must run the "
                         "same one (stop them all, upgrade, start them all)",
                         metric=PROTOCOL_REFUSED)
            return None
        if hello.timing != self.timing:
            self._refuse(hello.replica_id, "its lease timing differs: "
                         f"{self.timing.differences(hello.timing)}; every replica must have "
                         "the same tick_ms, lease_ticks and lease_drift_ticks")
            return None
        if not await self._hear_life(hello):
            return None
        if hello.stamp_ms is not None and heard_ms is not None and self.on_stamp is not None:
            self.on_stamp(hello.replica_id, hello.stamp_ms, heard_ms)
        self.refused.pop(hello.replica_id, None)
        reader.widen(self.frame_bytes_max)
        return hello.replica_id, stream, reader

    async def _hear_life(self, hello: Hello) -> bool:
        """Whether the dialer's life may be heard, written down first where it is new
        (`peer_lives.py`). A dialer that heard this replica in a life it no longer has
        stops this replica."""
        if self.lives is None:
            return True
        peer = hello.replica_id
        assert self._hearing_lives is not None
        async with self._hearing_lives:  # a second connection waits for the first's save
            forgotten = self.life.forgot(hello.yours)
            if forgotten is not None and self.rejoining():
                if self.on_old_life is not None:  # how far the lost life went
                    self.on_old_life(hello.yours)
            elif forgotten is not None:
                self._stop(DataDirectoryForgotten(self.lives.path, peer=peer, reason=forgotten))
                return False
            heard = self.lives.of(peer)
            refusal = hello.life.forgot(heard)
            if refusal is not None and hello.rejoining and hello.life.disk != heard.disk:
                refusal = self._rejoin_refusal()
            if refusal is None and hello.rejoining and heard.known and \
                    hello.life.disk != heard.disk:
                self.metrics[PEER_REJOINED] += 1
                if self.on_peer_rejoined is not None:  # before any frame of the new life
                    self.on_peer_rejoined(peer, heard)
                logger.warning("replica %d: replica %d rejoins on a new data directory (disk "
                               "%s, was %s): it takes part once every replica has told it "
                               "what it holds", self.replica_id, peer, hello.life.disk,
                               heard.disk)
            if refusal is not None:
                self._refuse(peer, f"{refusal}; it has forgotten promises a quorum may count "
                                   "on (a replica whose directory was lost comes back with "
                                   "--rejoin, which asks before it takes part)",
                             metric=LIFE_REFUSED)
                return False
            if self.lives.hear(peer, hello.life):
                try:
                    await anyio.to_thread.run_sync(self.lives.save)
                except StorageFailed as error:
                    self._stop(error)
                    return False
        return True

    def _rejoin_refusal(self) -> str | None:
        """None: a peer on a new directory that says it rejoins is taken (it asks before it
        takes part). Not without TLS: nothing proves who sent the hello, and taking a forged
        one would refuse the real replica's directory from then on."""
        if self.tls is None:
            return ("it says it rejoins on a new data directory, and without TLS nothing "
                    "proves the hello is its own: a rejoin needs TLS")
        return None

    def _refuse(self, peer: int, reason: str, *, metric: str = TIMING_REFUSED) -> None:
        """Count a peer refused for its hello; log the reason at its first time in a row."""
        self.metrics[metric] += 1
        if self.refused.get(peer) != reason:
            logger.error("replica %d: refused replica %d: %s", self.replica_id, peer, reason)
        self.refused[peer] = reason

    async def _receive_from(self, peer: int, stream: anyio.abc.ByteStream,
                            reader: FrameReader) -> None:
        self.metrics[CONNECTIONS_ACCEPTED] += 1
        link = self._links[peer]
        if link.inbound is not None:
            link.inbound.cancel()  # newest wins: the older connection is from a past life
        with anyio.CancelScope() as scope:
            link.inbound = scope
            try:
                await self._receive_forever(peer, reader)
            finally:
                if link.inbound is scope:
                    link.inbound = None
        await anyio.aclose_forcefully(stream)

    async def _receive_forever(self, peer: int, reader: FrameReader) -> None:
        while True:  # until the connection ends, breaks or misbehaves
            try:
                frames = await reader.receive_batch()
            except FrameTooLarge as error:
                self.metrics[FRAMES_REFUSED_OVERSIZED] += 1
                logger.warning("replica %d: replica %d: %s; closing", self.replica_id, peer,
                               error)
                return
            except TruncatedFrame:
                self.metrics[FRAMES_TRUNCATED] += 1
                return
            except anyio.EndOfStream:
                return
            except CONNECTION_ERRORS:
                self.metrics[CONNECTIONS_LOST] += 1
                return
            self.metrics[FRAMES_RECEIVED] += len(frames)
            # claimed: this task runs the turn that takes them (consensus/runtime/driver.py)
            turns = self.turns if self.turns is not None and self.turns.claim_turn() else None
            try:
                for frame in frames:
                    self.on_frame(peer, frame)
            finally:
                if turns is not None:
                    await turns.turn_here()
