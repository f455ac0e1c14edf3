"""Test-wide settings: Hypothesis profiles and the repository's example database, and the
`--rewrite` flag that regenerates golden files."""

from __future__ import annotations

import os
import pathlib

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

EXAMPLES = pathlib.Path(__file__).resolve().parent / "hypothesis-examples"

# Failing examples are kept in the repository, so a schedule that once broke something is
# replayed first on every machine, CI included.
settings.register_profile(
    "default",
    database=DirectoryBasedExampleDatabase(str(EXAMPLES)),
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


@pytest.fixture
def rewrite(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--rewrite"))
