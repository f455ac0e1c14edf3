"""The harness's own small exception hierarchy: conditions a caller branches on, never bugs.

A broken invariant inside the checker is an `AssertionError`. What a person can fix is one of
these: a history that breaks the event rules, a file that cannot be read as a history, an
operation the chosen model cannot interpret, a model that is not available in this build.
`cellar check` turns each of them into a message on stderr and exit status 3; none of them ever
yields a verdict.
"""

from __future__ import annotations


class JepsenError(Exception):
    """Base of every expected condition raised by `jepsen`."""


class HistoryError(JepsenError):
    """A sequence of events breaks the rules of a history: a completion with no invocation, a
    second invocation while one is pending, a completion of another function.

    `index` is the event's position (its logical time) when one event is to blame.
    """

    def __init__(self, message: str, *, index: int | None = None) -> None:
        super().__init__(message if index is None else f"event {index}: {message}")
        self.message = message  # without the location
        self.index = index


class HistoryFormatError(HistoryError):
    """A file that cannot be read as a history in the format it claims (or was detected as).

    Names the file, the line (1-based, when one line is to blame) and what was expected there.
    """

    def __init__(self, source: str, line: int | None, expected: str, *,
                 found: str | None = None) -> None:
        where = source if line is None else f"{source}:{line}"
        detail = f"expected {expected}" if found is None else f"expected {expected}, found {found}"
        super().__init__(f"{where}: {detail}")
        self.source = source
        self.line = line
        self.expected = expected
        self.found = found


class ModelError(JepsenError):
    """An operation the model cannot interpret: an unknown function, a value of the wrong shape.

    Raised before the search starts, so a history the model does not fit gets no verdict.
    `operation` is the id of the operation to blame, when there is one.
    """

    def __init__(self, message: str, *, operation: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.operation = operation


class ModelUnavailable(JepsenError):
    """A model named on the command line that this build cannot provide yet."""
