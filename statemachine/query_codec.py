"""Queries as bytes: `{"v": 1, "type": "group", ...}` maps in, plain maps out.

Decoding checks every field like command decoding does (sizes capped, path named); `limit` is
capped at `QUERY_LIMIT_MAX`. The answer is `{"ok": true, "type": ..., ...}` or a rejection.
"""

from __future__ import annotations

from typing import Any

from consensus.codec import pack
from statemachine import limits
from statemachine.errors import Code, Rejection
from statemachine.queries import (
    ClusterQuery,
    EffectsQuery,
    GroupQuery,
    GroupsQuery,
    NodeQuery,
    NodesQuery,
    Query,
    StatsQuery,
)
from statemachine.record_codec import Record, open_body, unpack_body

_LIMIT = {"low": 1, "high": limits.QUERY_LIMIT_MAX}
QUERIES: dict[str, tuple[str, ...]] = {
    "group": ("group", "node"), "groups": ("vc", "phase", "after", "limit"),
    "nodes": ("after", "limit"), "node": ("node",), "cluster": (),
    "effects": ("after", "node", "limit"), "stats": (),
}


def decode_query(data: bytes) -> Query:
    kind, raw = open_body(data, bytes_max=limits.QUERY_BYTES_MAX, what="query",
                          types=tuple(QUERIES))
    record = Record(raw, kind, ("v", "type", *QUERIES[kind]))
    if kind == "group":
        # node: absent for the whole gang (and in a query of a client before it)
        node = record.text("node") if record.has("node") else None
        return GroupQuery(group=record.text("group"), node=node)
    if kind == "groups":
        return GroupsQuery(vc=record.text("vc", allow_empty=True),
                           phase=record.text("phase", allow_empty=True),
                           after=record.text("after", allow_empty=True),
                           limit=record.integer("limit", **_LIMIT))
    if kind == "nodes":
        return NodesQuery(after=record.text("after", allow_empty=True),
                          limit=record.integer("limit", **_LIMIT))
    if kind == "node":
        return NodeQuery(node=record.text("node"))
    if kind == "effects":
        node = None if record.raw.get("node") is None else record.text("node", allow_empty=True)
        return EffectsQuery(after=record.integer("after"), node=node,
                            limit=record.integer("limit", **_LIMIT))
    if kind == "cluster":
        return ClusterQuery()
    return StatsQuery()


def encode_query(kind: str, **fields: Any) -> bytes:
    return pack({"v": limits.SCHEMA_VERSION, "type": kind, **fields})


_KINDS: dict[type, str] = {
    GroupQuery: "group", GroupsQuery: "groups", NodesQuery: "nodes", NodeQuery: "node",
    ClusterQuery: "cluster", EffectsQuery: "effects", StatsQuery: "stats",
}


def encode_typed_query(query: Query) -> bytes:
    """`query` as bytes that `decode_query` reads back equal (a gang query's node left out
    when it has none, as a client before it sends it)."""
    kind = _KINDS[type(query)]
    fields = {name: getattr(query, name) for name in QUERIES[kind]}
    if isinstance(query, GroupQuery) and query.node is None:
        del fields["node"]
    return encode_query(kind, **fields)


def encode_answer(answer: dict[str, Any] | Rejection) -> bytes:
    if isinstance(answer, Rejection):
        return pack({"ok": False, "code": answer.code.value, "message": answer.message})
    return pack({"ok": True, **answer})


ANSWER_BYTES_MAX = 64 << 20


def decode_answer(data: bytes) -> dict[str, Any] | Rejection:
    """A query's answer as the client sees it: the plain map, or the rejection."""
    raw = unpack_body(data, bytes_max=ANSWER_BYTES_MAX, what="answer")
    if type(raw) is not dict or type(raw.get("ok")) is not bool:
        raise ValueError("answer: expected a map with a boolean `ok`")
    if raw["ok"] is False:
        record = Record(raw, "answer", ("ok", "code", "message"))
        return Rejection(code=Code(record.choice("code", tuple(Code))),
                         message=record.text("message", length_max=ANSWER_BYTES_MAX))
    return {key: value for key, value in raw.items() if key != "ok"}
