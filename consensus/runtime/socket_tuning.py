"""TCP settings that notice a vanished host: keepalive, and a user timeout for unacknowledged
writes, on every connection a replica or a client makes or accepts.

A host that loses power or drops off the network sends no FIN: without these, the other end's
connection stays ESTABLISHED for TCP's quarter of an hour (a write's retries) or for ever (an
idle reader). Peer links take both, so a dead peer is noticed within seconds; a replica's
connections from clients take keepalive only, since a client may stop reading for a while (the
server's own bound on unread answers rules that, `server.ANSWERS_STALL_S`); a client takes
both on its connections to replicas, so a request to a vanished replica fails and is tried
elsewhere instead of waiting out its deadline.
"""

from __future__ import annotations

import contextlib
import socket

import anyio.abc

# Dead hosts that send no FIN: notice within seconds, not TCP's quarter of an hour.
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES = 5, 2, 3
USER_TIMEOUT_MS = 15_000


def tune_socket(stream: anyio.abc.ByteStream, *, user_timeout: bool = True) -> None:
    """Keepalive and (unless `user_timeout` is False) a user timeout, where the platform has
    them; a stream without a socket (a test's memory stream) is left as it is."""
    sock = stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
    if sock is None:
        return
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    tuned = [("TCP_KEEPIDLE", KEEPALIVE_IDLE_S), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
             ("TCP_KEEPCNT", KEEPALIVE_PROBES)]
    if user_timeout:
        tuned.append(("TCP_USER_TIMEOUT", USER_TIMEOUT_MS))
    for name, value in tuned:
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    for level, option, value in options:
        with contextlib.suppress(OSError):  # a platform without the option
            sock.setsockopt(level, option, value)
