"""Test-wide settings: Hypothesis profiles and the repository's example database, the
`--rewrite` flag that regenerates golden files, and a guard against a race in asyncio's
selector loop (below)."""

from __future__ import annotations

import os
import pathlib
from asyncio import selector_events
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.database import (
    DirectoryBasedExampleDatabase,
    MultiplexedDatabase,
    ReadOnlyDatabase,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "tests" / "hypothesis-examples"
LOCAL_EXAMPLES = ROOT / ".hypothesis" / "examples"

# Examples that once failed are kept in the repository and replayed first on every machine,
# CI included; the repository's copy is read-only (a run never rewrites the checkout) and new
# failures land in the ignored .hypothesis/ (copy one into tests/hypothesis-examples/ to keep
# it, and add its schedule to the test's regressions).
settings.register_profile(
    "default",
    database=MultiplexedDatabase(ReadOnlyDatabase(DirectoryBasedExampleDatabase(str(EXAMPLES))),
                                 DirectoryBasedExampleDatabase(str(LOCAL_EXAMPLES))),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("ci", parent=settings.get_profile("default"), derandomize=True,
                          print_blob=True)
settings.register_profile("nightly", parent=settings.get_profile("default"), max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI")
                                     else "default"))


def _accept_only_into_a_waiting_future() -> None:
    """CPython's selector loop (3.11 to 3.13) accepts a connection into a `sock_accept` future
    cancelled earlier in the same loop turn, and raises InvalidStateError in that callback;
    anyio's test runner then fails whichever test closed a listener while a peer dialed it (a
    peer mesh's teardown). The connection is left in the backlog instead, as a cancelled
    accept means. Tests only: a replica just logs the error."""
    accept = selector_events.BaseSelectorEventLoop._sock_accept  # type: ignore[attr-defined]

    def guarded(self: Any, future: Any, sock: Any) -> None:
        if not future.done():
            accept(self, future, sock)

    selector_events.BaseSelectorEventLoop._sock_accept = guarded  # type: ignore[attr-defined]


_accept_only_into_a_waiting_future()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--rewrite", action="store_true", default=False,
                     help="rewrite golden files with the output the code produces now")


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Every anyio test runs on both backends: the runtime promises trio and asyncio alike."""
    return str(request.param)


@pytest.fixture
def rewrite(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--rewrite"))
