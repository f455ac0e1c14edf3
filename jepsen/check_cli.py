"""`cellar check FILE --model MODEL`: is this history linearizable?

Reads a history in any format `jepsen.formats` knows (detected from the file unless `--format`
names one), checks it against the model, prints a short summary (or, with `--json`, one JSON
object) and optionally writes the HTML report. Each format has its customary initial value
(nil for Jepsen etcd logs, 0 for Knossos histories, "" for Porcupine's key-value logs);
`--initial` overrides it, read as JSON (`0`, `null`, `"x"`) or else as a plain string.

Exit status: 0 linearizable, 1 not linearizable, 2 unknown (the time budget, or the search's
memory budget of 2 GiB, ran out), 3 nothing was checked, or its report could not be written (a
file that cannot be read, a model that does not fit the history or is not available, bad
arguments, an `--html` path that cannot be written). A status 3 comes with one line on stderr,
never a traceback.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from consensus.runtime.arguments import seconds, usage_errors_exit
from jepsen.checker import check
from jepsen.errors import JepsenError, ModelError
from jepsen.formats import FORMAT_NAMES, UNSET, load
from jepsen.formats.edn import DEPTH_MAX
from jepsen.formats.native import deeper_than
from jepsen.history import freeze
from jepsen.models import MODEL_NAMES, model_named
from jepsen.report import html_report, result_json, text_summary
from jepsen.verdict import Verdict

EXIT_LINEARIZABLE, EXIT_NOT_LINEARIZABLE, EXIT_UNKNOWN, EXIT_UNREADABLE = 0, 1, 2, 3
TIMEOUT_S_DEFAULT = 60.0


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="the history to check")
    parser.add_argument("--model", required=True, metavar="MODEL",
                        help=f"the sequential specification: {', '.join(MODEL_NAMES)}")
    parser.add_argument("--initial", metavar="VALUE",
                        help="initial value (JSON, else a string); default: the format's own")
    parser.add_argument("--format", metavar="FORMAT",
                        help=f"{', '.join(FORMAT_NAMES)}; default: detected from the file")
    parser.add_argument("--timeout", type=seconds(zero_ok=True), default=TIMEOUT_S_DEFAULT,
                        metavar="SECONDS",
                        help=f"time budget; past it the verdict is unknown (default "
                             f"{TIMEOUT_S_DEFAULT:g}; 0: none)")
    parser.add_argument("--html", metavar="OUT", help="write the HTML report to OUT")
    parser.add_argument("--json", action="store_true", help="print one JSON object")

    usage_errors_exit(parser, EXIT_UNREADABLE)  # 3, not 2: that says the verdict is unknown
    parser.set_defaults(handler=run)


def parse_initial(text: str) -> object:
    """`--initial`: a JSON value within a history's limits, else the text as a string;
    TypeError when it is JSON no history could hold (too deep, an integer too long)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    except RecursionError:
        raise TypeError(f"nested more than {DEPTH_MAX} deep") from None
    except ValueError as error:
        raise TypeError(str(error)) from None
    if deeper_than(value, DEPTH_MAX):
        raise TypeError(f"nested more than {DEPTH_MAX} deep")
    return value


def run(args: argparse.Namespace) -> int:
    history = None
    try:
        _check_writable(args.html)
        loaded = load(args.file, args.format)
        history = loaded.history
        initial = loaded.initial if args.initial is None else _initial(args.initial)
        model = model_named(args.model, None if initial is UNSET else freeze(initial))
        result = check(model, history, timeout_s=args.timeout or None)
    except ModelError as error:
        where = "" if history is None or error.operation is None else (
            history.where(history.operations[error.operation].call) + ": ")
        return _unreadable(f"{where}{error.message}")
    except (JepsenError, OSError, TypeError) as error:
        return _unreadable(str(error))
    if args.html:
        try:
            pathlib.Path(args.html).write_text(
                html_report(history, result, format=loaded.format), encoding="utf-8")
        except OSError as error:
            return _unreadable(f"--html: {error}")
    if args.json:
        print(json.dumps(result_json(history, result, format=loaded.format)))
    else:
        print(text_summary(history, result, format=loaded.format))
    return {Verdict.LINEARIZABLE: EXIT_LINEARIZABLE,
            Verdict.NOT_LINEARIZABLE: EXIT_NOT_LINEARIZABLE,
            Verdict.UNKNOWN: EXIT_UNKNOWN}[result.verdict]


def _initial(text: str) -> object:
    try:
        return freeze(parse_initial(text))
    except TypeError as error:
        raise TypeError(f"--initial: {error}") from None


def _check_writable(html: str | None) -> None:
    """Refuse an --html path that cannot be written before spending the check's time on it."""
    if html is None:
        return
    path = pathlib.Path(html)
    if path.is_dir():
        raise OSError(f"--html: {html} is a directory")
    if not path.parent.is_dir():
        raise OSError(f"--html: no directory {str(path.parent)!r} to write {path.name} into")


def _unreadable(message: str) -> int:
    print(f"cellar check: {message}", file=sys.stderr)
    return EXIT_UNREADABLE
