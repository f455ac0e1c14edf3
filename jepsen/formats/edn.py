"""A small EDN reader: the subset Jepsen, Knossos and Porcupine histories use, and a little more.

Reads nil, true, false, integers (with an optional N), floats (with an optional M), strings with
escapes, characters, keywords, symbols, vectors, lists, maps, sets, `;` comments, commas as
whitespace, `#_` discards and tagged literals (`#inst "..."`, kept as `Tagged`). Vectors and
lists become tuples, maps dicts, sets frozensets. Every error names the line and what was
expected there; nesting deeper than `DEPTH_MAX` is refused rather than recursed into.

`to_value` turns what the reader returns into a history `Value` (keywords and symbols become
their names, maps lists of pairs).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from jepsen.errors import HistoryFormatError
from jepsen.history import Value

DEPTH_MAX = 64


class Keyword:
    """An EDN keyword. Interned: one object per name, so equality and hashing are identity's
    (fast, as map keys are keywords nearly always)."""

    __slots__ = ("name",)
    _interned: dict[str, Keyword] = {}  # a cache shared by the class, on purpose
    name: str

    def __new__(cls, name: str) -> Keyword:
        keyword = cls._interned.get(name)
        if keyword is None:
            keyword = super().__new__(cls)
            object.__setattr__(keyword, "name", name)
            cls._interned[name] = keyword
        return keyword

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("keywords are immutable")

    def __repr__(self) -> str:
        return f"Keyword({self.name!r})"

    def __str__(self) -> str:
        return ":" + self.name


@dataclass(frozen=True, slots=True)
class Symbol:
    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class Tagged:
    tag: str
    value: object


_TOKEN = re.compile(r"""
    (?:[\s,]|;[^\n]*)*+  # whitespace, commas and comments, never backtracked into
    (?:
      (?P<string>"(?:[^"\\]|\\.)*")
    | (?P<open>\#\{|[\[({])
    | (?P<close>[\])}])
    | (?P<discard>\#_)
    | (?P<tag>\#[A-Za-z][^\s,\[\](){}"]*)
    | (?P<char>\\(?:newline|space|tab|return|u[0-9A-Fa-f]{4}|\S))
    | (?P<atom>[^\s,\[\](){}"\\\#;][^\s,\[\](){}"\\;]*)
    | (?P<end>\Z)
    )
""", re.VERBOSE | re.DOTALL)
_SPACE = re.compile(r"(?:[\s,]|;[^\n]*)*+")
_INTEGER = re.compile(r"[+-]?\d+N?")
_FLOAT = re.compile(r"[+-]?\d+(?:\.\d*)?(?:[eE][+-]?\d+)?M?")
_ESCAPES = {'"': '"', "\\": "\\", "n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f",
            "/": "/"}
_CHARACTERS = {"newline": "\n", "space": " ", "tab": "\t", "return": "\r"}
_CLOSERS = {"[": "]", "(": ")", "{": "}", "#{": "}"}
_END = object()


def _unescape(body: str) -> str:
    if "\\" not in body:
        return body
    out, index = [], 0
    while index < len(body):
        char = body[index]
        if char != "\\":
            out.append(char)
            index += 1
            continue
        escape = body[index + 1]
        if escape == "u":
            out.append(chr(int(body[index + 2:index + 6], 16)))
            index += 6
            continue
        if escape not in _ESCAPES:
            raise ValueError(f"unknown string escape \\{escape}")
        out.append(_ESCAPES[escape])
        index += 2
    return "".join(out)


def _atom(text: str) -> object:
    first = text[0]
    if first == ":":
        if len(text) == 1 or text[1] == ":":
            raise ValueError(f"malformed keyword {text}")
        return Keyword(text[1:])
    if first.isdigit() or (first in "+-" and len(text) > 1 and text[1].isdigit()):
        if _INTEGER.fullmatch(text):
            return int(text.rstrip("N"))
        if _FLOAT.fullmatch(text):
            return float(text.rstrip("M"))
        raise ValueError(f"malformed number {text}")
    if text == "nil":
        return None
    if text in ("true", "false"):
        return text == "true"
    return Symbol(text)


class Reader:
    """Reads forms one at a time from `text`, tracking lines for messages."""

    def __init__(self, text: str, source: str, *, first_line: int = 1) -> None:
        self.text = text
        self.source = source
        self.position = 0
        self._line = first_line
        self._line_position = 0

    def line_at(self, position: int) -> int:
        """The line of `position`, counted on from the last position asked about."""
        if position < self._line_position:
            return self._line - self.text.count("\n", position, self._line_position)
        self._line += self.text.count("\n", self._line_position, position)
        self._line_position = position
        return self._line

    def error(self, expected: str, position: int, found: str | None = None) -> HistoryFormatError:
        return HistoryFormatError(self.source, self.line_at(position), expected, found=found)

    def _token(self) -> tuple[str, str, int]:
        """The next meaningful token: (kind, text, start); kind "end" at the end."""
        match = _TOKEN.match(self.text, self.position)
        if match is None:
            start = _SPACE.match(self.text, self.position).end()  # type: ignore[union-attr]
            found = self.text[start:start + 12].split("\n")[0]
            raise self.error("an EDN form", start, found=repr(found))
        kind = match.lastgroup
        assert kind is not None
        self.position = match.end()
        return kind, match.group(kind), match.start(kind)

    def at_end(self) -> bool:
        kind, _, start = self._token()
        self.position = start
        return kind == "end"

    def read(self) -> object:
        """The next form; an error at the end of the text."""
        form = self._read(0)
        if form is _END:
            raise self.error("an EDN form", self.position, found="the end of the text")
        return form

    def _read(self, depth: int, closer: str | None = None) -> object:
        if depth > DEPTH_MAX:
            raise self.error(f"forms nested at most {DEPTH_MAX} deep", self.position)
        kind, token, start = self._token()
        if kind == "end":
            if closer is not None:
                raise self.error(f"{closer!r} to close a collection", start,
                                 found="the end of the text")
            return _END
        if kind == "close":
            if token != closer:
                raise self.error("a form" if closer is None else f"{closer!r}", start,
                                 found=repr(token))
            return _END
        if kind == "open":
            return self._collection(token, start, depth)
        if kind == "discard":
            self._read(depth + 1)
            return self._read(depth, closer)
        if kind == "tag":
            return Tagged(token[1:], self._read_required(depth + 1, start))
        return self._scalar(kind, token, start)

    def _read_required(self, depth: int, start: int) -> object:
        form = self._read(depth)
        if form is _END:
            raise self.error("a form after a tag or discard", start)
        return form

    def _scalar(self, kind: str, token: str, start: int) -> object:
        try:
            if kind == "string":
                return _unescape(token[1:-1])
            if kind == "char":
                name = token[1:]
                if name.startswith("u") and len(name) == 5:
                    return chr(int(name[1:], 16))
                return _CHARACTERS.get(name, name)
            return _atom(token)
        except ValueError as error:
            raise self.error("a well-formed EDN value", start, found=str(error)) from None

    def _collection(self, opener: str, start: int, depth: int) -> object:
        closer = _CLOSERS[opener]
        items = []
        while True:
            item = self._read(depth + 1, closer)
            if item is _END:
                break
            items.append(item)
        if opener in ("[", "("):
            return tuple(items)
        if opener == "#{":
            members = frozenset(_hashable(self, item, start) for item in items)
            if len(members) != len(items):  # EDN refuses a repeated member; so does a set
                raise self.error("a set without repeated members", start)  # of 1 and true
            return members
        if len(items) % 2:
            raise self.error("a map with an even number of forms", start)
        mapping = {_hashable(self, items[index], start): items[index + 1]
                   for index in range(0, len(items), 2)}
        if len(mapping) != len(items) // 2:  # a repeated key (or 1 and true: one to Python)
            raise self.error("a map without repeated keys", start)
        return mapping

    def sequence_items(self) -> Iterator[tuple[int, object]]:
        """The items of the one top-level vector or list, each with the line it starts on."""
        kind, token, start = self._token()
        if kind != "open" or token not in ("[", "("):
            raise self.error("a vector or list of operations", start,
                             found="the end of the text" if kind == "end" else repr(token))
        closer = _CLOSERS[token]
        while True:
            _, _, item_start = self._token()
            self.position = item_start
            line = self.line_at(item_start)
            item = self._read(1, closer)
            if item is _END:
                break
            yield line, item
        if not self.at_end():
            raise self.error("nothing after the closing " + repr(closer), self.position)


def _hashable(reader: Reader, item: object, start: int) -> object:
    try:
        hash(item)
    except TypeError:
        raise reader.error("a map key or set member that is not a map", start) from None
    return item


def read_one(text: str, source: str, *, line: int = 1) -> object:
    """Exactly one form in `text` (a line of a line-per-form file, say)."""
    reader = Reader(text, source, first_line=line)
    form = reader.read()
    if not reader.at_end():
        raise reader.error("one form only", reader.position)
    return form


def to_value(form: object) -> Value:
    """An EDN form as a history value: keywords and symbols by name, maps as lists of pairs,
    sets sorted, tagged literals as their text."""
    if form is None or isinstance(form, bool | int | float | str):
        return form
    if isinstance(form, Keyword | Symbol):
        return form.name
    if isinstance(form, tuple):
        return tuple(to_value(item) for item in form)
    if isinstance(form, dict):
        return tuple((to_value(key), to_value(value)) for key, value in form.items())
    if isinstance(form, frozenset):
        return tuple(sorted((to_value(item) for item in form), key=repr))
    if isinstance(form, Tagged):
        return f"#{form.tag} {to_value(form.value)!r}"
    raise TypeError(f"not an EDN form: {form!r}")
