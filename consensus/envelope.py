"""The envelope: how a client's command enters the replicated log.

The state machine's command is opaque bytes (`body`); around it the runtime puts what it vouches
for and the state machine needs to stay deterministic and safe:

- `principal`: who sent it, taken from the client's TLS certificate, never from the client's
  own words. The state machine checks it (a node agent acts only for its own node, only an admin
  changes the configuration).
- `session` and `sequence`: the client's exactly-once session; the state machine caches the
  reply to the latest sequence of each session.
- `now_ms`: the proposing replica's clock when it proposed; the state machine clamps it to be
  monotonic, so time enters only as data.

The encoding lives in `consensus.codec`; this module holds the types and their limits.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

BODY_BYTES_MAX = 1 << 20
SESSION_LENGTH_MAX = 128
PRINCIPAL_NAME_LENGTH_MAX = 253
# What a certificate may name (consensus/runtime/tls.py): so a node id outside it could never
# register under TLS, and a cluster's configuration refuses it.
PRINCIPAL_NAME_PATTERN = rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{PRINCIPAL_NAME_LENGTH_MAX - 1}}}"
_PRINCIPAL_NAME = re.compile(PRINCIPAL_NAME_PATTERN)


def is_principal_name(name: str) -> bool:
    return _PRINCIPAL_NAME.fullmatch(name) is not None


class Role(enum.StrEnum):
    """What a principal may do; the state machine decides which commands each role may issue."""

    ADMIN = "admin"
    SCHEDULER = "scheduler"
    NODE = "node"  # a node agent; its principal name is its node id
    SYSTEM = "system"  # the runtime itself (ticks); no client certificate can carry it


@dataclass(frozen=True, slots=True)
class Principal:
    role: Role
    name: str
    # "role:name", made once: the state machines key every command's session by it
    text: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "text", f"{self.role.value}:{self.name}")

    def __str__(self) -> str:
        return self.text


SYSTEM_PRINCIPAL = Principal(Role.SYSTEM, "cellar")


@dataclass(frozen=True, slots=True, kw_only=True)
class Envelope:
    principal: Principal
    session: str
    sequence: int  # >= 1 within a session; 0 means "no session" (idempotent system commands)
    now_ms: int
    body: bytes
