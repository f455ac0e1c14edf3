"""`cellar admin`: the state machine's admin commands and queries (see cellar.ops_cli)."""

from __future__ import annotations

import argparse

from cellar.ops_cli import configure_admin


def configure(parser: argparse.ArgumentParser) -> None:
    configure_admin(parser)
