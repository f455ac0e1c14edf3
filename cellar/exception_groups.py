"""The one error an anyio task group wrapped, taken out again for a command line to handle.

anyio's task groups raise what fails inside them as a `BaseExceptionGroup`, even a single error
raised by the group's own body; the client library runs in one (its connections' tasks), so a
`ClientError` from any client call, or a `SystemExit` with a command's message, reaches a
command's `anyio.run` wrapped in one group per task group it crossed. An `except ClientError`
or a `SystemExit` around `anyio.run` then never matches: the user gets a group's traceback and
exit status 1 instead of the command's own message and status.

`run_unwrapped` is `anyio.run` for commands: a group that holds one error, directly or through
nested groups of one, is raised as that error, with its own traceback, cause and context; a
group of several errors stays a group (several things went wrong, and each deserves its
traceback).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, TypeVarTuple

import anyio

T = TypeVar("T")
Arguments = TypeVarTuple("Arguments")


def sole_exception(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The one error `group` holds, through any nesting of groups of one; None if several."""
    found: BaseException = group
    while isinstance(found, BaseExceptionGroup):
        if len(found.exceptions) != 1:
            return None
        found = found.exceptions[0]
    return found


def run_unwrapped(function: Callable[[*Arguments], Awaitable[T]],
                  *args: *Arguments, backend: str = "asyncio",
                  backend_options: dict[str, Any] | None = None) -> T:
    """`anyio.run(function, *args, ...)`, raising the single error a task group wrapped."""
    try:
        return anyio.run(function, *args, backend=backend, backend_options=backend_options)
    except BaseExceptionGroup as group:
        sole = sole_exception(group)
        if sole is None:
            raise
    # Raised outside the handler, so the group does not become its implicit context.
    raise sole
