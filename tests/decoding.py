"""Comparing a decoder's fast path with its field-by-field checks: what a decode decides (its
value, or InvalidMessage), and inputs near a valid record (one field changed); and fuzzing
a decoder with inputs near its valid encodings, letting through only its documented error."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import msgpack
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from consensus.codec import pack
from consensus.errors import InvalidMessage


def outcome(decode: Callable[[], object]) -> object:
    """What `decode()` returns, or InvalidMessage when it refuses the input."""
    try:
        return decode()
    except InvalidMessage:
        return InvalidMessage


def one_field_changed(valid: list[object], fields: st.SearchStrategy[object]
                      ) -> st.SearchStrategy[list[object]]:
    """`valid` with one of its fields replaced by a value drawn from `fields`."""
    return st.tuples(st.integers(0, len(valid) - 1), fields).map(
        lambda change: [change[1] if index == change[0] else value
                        for index, value in enumerate(valid)])


# --- fuzzing decoders: inputs near valid encodings -----------------------------------------------

# Decoders are fed random bytes, valid encodings with a few bytes changed, and valid values
# with one node of their msgpack tree replaced: the example count is the profile's (the
# nightly one runs many more); every health check is off, as the strategies filter and nest.
FUZZ = settings(suppress_health_check=list(HealthCheck))

any_msgpack = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
    | st.text(max_size=12) | st.binary(max_size=12),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=20,
)


@st.composite
def mutated(draw: st.DrawFn, valid: st.SearchStrategy[bytes]) -> bytes:
    """A valid encoding with a few bytes flipped, inserted, deleted, or cut short."""
    data = bytearray(draw(valid))
    for _ in range(draw(st.integers(1, 4))):
        how = draw(st.sampled_from(["flip", "insert", "delete", "cut"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if how == "flip" and data:
            data[at] = draw(st.integers(0, 255))
        elif how == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=4))
        elif how == "delete" and data:
            del data[at]
        elif how == "cut":
            del data[at:]
    return bytes(data)


@st.composite
def structurally_changed(draw: st.DrawFn, valid: st.SearchStrategy[Any]) -> bytes:
    """A valid value (a decoded msgpack tree), packed with one node replaced by any value."""
    def walk(node: Any) -> Any:
        if isinstance(node, list) and node and draw(st.booleans()):
            index = draw(st.integers(0, len(node) - 1))
            return [walk(item) if position == index else item
                    for position, item in enumerate(node)]
        if isinstance(node, dict) and node and draw(st.booleans()):
            key = draw(st.sampled_from(sorted(node, key=repr)))
            return {name: walk(item) if name == key else item for name, item in node.items()}
        return draw(any_msgpack)

    return pack(walk(draw(valid)))


def near(encodings: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    """Random bytes, and inputs near the valid `encodings`: mutated, or changed in shape."""
    return (st.binary(max_size=300) | mutated(encodings)
            | structurally_changed(encodings.map(plain)))


def plain(data: bytes) -> Any:
    """The msgpack tree of an encoding."""
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def raises_only(decode: Callable[[bytes], object], data: bytes,
                *allowed: type[BaseException]) -> None:
    """`decode(data)`, letting only `allowed` errors (its documented refusals) through."""
    with contextlib.suppress(*allowed):
        decode(data)
