"""Comparing a decoder's fast path with its field-by-field checks: what a decode decides (its
value, or InvalidMessage), and inputs near a valid record (one field changed)."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import strategies as st

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
