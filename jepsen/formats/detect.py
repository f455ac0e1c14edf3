"""Tells a history file's format from its first meaningful line.

- a JSON object: Cellar's JSON lines (also a broken one: a quoted key first, or a file named
  `.json`/`.jsonl`, so that the JSON reader says what is wrong);
- an EDN map (`{:process ...`): Porcupine's key-value lines;
- a vector or list (`[`, `(`): a Knossos history;
- a line with `jepsen.util - ` anywhere in the file: a Jepsen text log.

An empty file is an empty history (in Cellar's format). Anything else is an error that asks for
`--format`.
"""

from __future__ import annotations

import json

from jepsen.errors import HistoryFormatError

_JEPSEN_MARKER = "jepsen.util"


def _is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except json.JSONDecodeError:
        return False
    except RecursionError:  # JSON nested too deep to decode: the JSON reader says so
        return True


def _looks_json(line: str, source: str) -> bool:
    """A line that is no JSON object but was meant as one (a quoted key first, where EDN has a
    keyword, or a file named as JSON): the JSON reader names what is wrong with it."""
    return line[1:].lstrip().startswith('"') or source.endswith((".json", ".jsonl"))


def detect(text: str, source: str) -> str:
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(";"):
            continue
        if _JEPSEN_MARKER in line:
            return "jepsen-log"
        if line.startswith(("[", "(")):
            return "knossos"
        if line.startswith("{"):
            return "jsonl" if _is_json_object(line) or _looks_json(line, source) else \
                "porcupine-kv"
        if _JEPSEN_MARKER in text:
            return "jepsen-log"
        raise HistoryFormatError(source, number, "a history: JSON lines, a Jepsen log, EDN "
                                 "operation maps or an EDN vector (or name one with --format)",
                                 found=repr(line[:40]))
    return "jsonl"
