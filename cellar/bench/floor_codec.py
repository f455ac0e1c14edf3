"""The bytes of `cellar bench floor`'s messages: plain msgpack, as Cellar's own frames are.

Requests are `[[request_id, put], ...]`, a batch to the followers `[batch_id, [put, ...]]`, an
acknowledgement the batch id, an answer the request ids; a put is `[key, value]`, decoded on
its own by every process as a replica's apply decodes each command.
"""

from __future__ import annotations

from typing import Any

import msgpack


def encode(value: Any) -> bytes:
    packed: bytes = msgpack.packb(value)
    return packed


def decode(data: bytes) -> Any:
    return msgpack.unpackb(data)


def encode_put(key: bytes, value: bytes) -> bytes:
    return encode((key, value))


def decode_put(command: bytes) -> tuple[bytes, bytes]:
    key, value = msgpack.unpackb(command)
    return key, value
