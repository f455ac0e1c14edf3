"""Tells a history file's format from its first meaningful line.

- a JSON object: Cellar's JSON lines;
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
            return "jsonl" if _is_json_object(line) else "porcupine-kv"
        if _JEPSEN_MARKER in text:
            return "jepsen-log"
        raise HistoryFormatError(source, number, "a history: JSON lines, a Jepsen log, EDN "
                                 "operation maps or an EDN vector (or name one with --format)",
                                 found=repr(line[:40]))
    return "jsonl"
