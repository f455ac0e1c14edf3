"""Test-wide settings: Hypothesis profiles and the repository's example database, and the
`--rewrite` flag that regenerates golden files."""

from __future__ import annotations

import os
import pathlib

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
