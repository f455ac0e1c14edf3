"""History formats: Cellar's own JSON lines, and the formats other tools publish.

| name | what | customary initial value |
| --- | --- | --- |
| `jsonl` | Cellar's JSON lines (`native`), written by `save` | nil, or the header's |
| `jepsen-log` | Jepsen text logs of the etcd tests | nil (the key starts absent) |
| `porcupine-kv` | Porcupine's key-value logs, one EDN map per line | "" |
| `knossos` | a Knossos EDN vector of operation maps | 0 |

`load` reads a file, detecting the format when none is named; every reader names the line and
what it expected when a file is malformed, and never returns half a history. `edn_writer`
writes Jepsen EDN for Knossos or Elle.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from dataclasses import dataclass

from jepsen.errors import HistoryFormatError
from jepsen.formats import jepsen_log, knossos, native, porcupine_kv
from jepsen.formats.detect import detect
from jepsen.history import History, Value

Parser = Callable[[str, str], tuple[History, object]]
PARSERS: dict[str, Parser] = {
    native.NAME: native.parse,
    jepsen_log.NAME: jepsen_log.parse,
    porcupine_kv.NAME: porcupine_kv.parse,
    knossos.NAME: knossos.parse,
}
FORMAT_NAMES = tuple(PARSERS)
UNSET = native.UNSET


@dataclass(frozen=True, slots=True)
class Loaded:
    """A history read from a file, the format it was read as, and that format's customary
    initial value (UNSET when the format has none: the model's default applies)."""

    history: History
    format: str
    initial: object


def parse(text: str, source: str, format: str | None = None) -> Loaded:
    name = detect(text, source) if format is None else format
    if name not in PARSERS:
        raise HistoryFormatError(source, None, f"a format among {', '.join(FORMAT_NAMES)}",
                                 found=repr(name))
    history, initial = PARSERS[name](text, source)
    return Loaded(history, name, initial)


def load(path: str | pathlib.Path, format: str | None = None) -> Loaded:
    """Read a history file. Raises `HistoryFormatError` for a file that is not a history and
    `OSError` for one that cannot be read."""
    source = str(path)
    data = pathlib.Path(path).read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[:error.start].count(b"\n") + 1
        raise HistoryFormatError(source, line, "UTF-8 text", found="undecodable bytes") from None
    return parse(text, source, format)


def save(history: History, path: str | pathlib.Path, *, initial: Value | object = UNSET
         ) -> None:
    """Write a history as Cellar JSON lines (see `native`)."""
    pathlib.Path(path).write_text(native.dumps(history, initial=initial), encoding="utf-8")
